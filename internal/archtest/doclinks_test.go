package archtest

import (
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/token"
	"regexp"
	"strings"
	"testing"
)

// notImported marks, in a doc link's import path, a package name that nothing resolves.
const notImported = "\x00"

// Every doc link in every doc comment of the module's packages names something that
// exists, so that go doc and pkg.go.dev render it as a link and it says something true.
//
// A doc comment is a package clause's, a declaration's, a type's, a field's or an
// interface method's (test files aside). Links are found as go/doc/comment finds them
// ([Name], [Name.Member], [*Name], [pkg], [pkg.Name], [pkg.Name.Member],
// [importpath.Name]; a [text] defined as a URL link is not a doc link), with the fields
// or methods written right after one ([Config].Retention), and resolved as go doc
// resolves them:
//
//   - [Name] and [Name.Member] name an exported identifier of the comment's own
//     package; Member is a field or method, promoted ones included.
//   - In [pkg.Name], pkg is the name under which the comment's package imports a
//     package (its alias if it has one; in any of its files, and in only one sense), or
//     a standard library package with a one-element path ([context.Context]). A package
//     the comment's package does not import, another of oncekit's included, cannot be
//     named so: go doc shows such a link as text in brackets, and the check reports it.
//   - A full import path ([go.temporal.io/sdk/worker.New]) names that package.
//
// The identifier is looked up in the exported API of the package it names, read from
// the export data go list -export leaves in the build cache, so links into pgx or
// Temporal's SDK are checked as offline as links within oncekit. A lone [word] that
// names no package is prose in brackets, as go doc treats it, and is left alone.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	m := loadModule(t)
	checked := 0
	for _, sp := range m.pkgs {
		pkgImports := map[string]string{} // "" when two files import different packages under one name
		for _, f := range sp.files {
			for _, spec := range f.Imports {
				if name, path := m.importName(spec); name != "" {
					if old, ok := pkgImports[name]; ok && old != path {
						path = ""
					}
					pkgImports[name] = path
				}
			}
		}
		p := &comment.Parser{
			LookupPackage: func(name string) (string, bool) {
				if path, ok := pkgImports[name]; ok && path != "" {
					return path, true
				} else if ok {
					return notImported + name, true // ambiguous: go doc links neither
				}
				if path, ok := comment.DefaultLookupPackage(name); ok {
					return path, true
				}
				return notImported + name, true
			},
			// Every [Name] is taken as a link here, so that one naming nothing is
			// reported rather than left as plain text.
			LookupSym: func(recv, name string) bool { return true },
		}
		for _, f := range sp.files {
			for _, cg := range docComments(f) {
				c := &cursor{fset: m.fset, cg: cg}
				for _, l := range docLinks(p.Parse(cg.Text())) {
					text := plainText(l.Text)
					pos := c.find("[" + text + "]")
					if strings.HasPrefix(l.ImportPath, notImported) && l.Name == "" {
						continue // [word]: prose in brackets
					}
					checked++
					members := memberSuffix.FindString(l.after)
					if err := m.resolveDocLink(sp, l.DocLink, members); err != nil {
						t.Errorf("%s: [%s]%s: %v", pos, text, members, err)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no doc link found in the module: the checker is broken")
	}
	t.Logf("%d doc links in %d packages checked", checked, len(m.pkgs))
}

// memberSuffix matches the fields or methods that follow a doc link, as in
// [Config].Retention.
var memberSuffix = regexp.MustCompile(`^(\.[\p{Lu}][\pL\pN_]*)+`)

// resolveDocLink checks that the identifier a doc link in package sp names exists, and
// the members that follow it (".Retention" after [Config]).
func (m *module) resolveDocLink(sp *sourcePkg, dl *comment.DocLink, members string) error {
	path := dl.ImportPath
	if name, ok := strings.CutPrefix(path, notImported); ok {
		return fmt.Errorf("package %s imports no package named %s, so go doc shows this as text in brackets: drop the brackets, or write the full import path", sp.name, name)
	}
	if path == "" {
		path = sp.path
	}
	pkg, err := m.pkg(path)
	if err != nil {
		return fmt.Errorf("cannot load package %s: %w", path, err)
	}
	var names []string
	if dl.Recv != "" {
		names = append(names, dl.Recv)
	}
	if dl.Name != "" {
		names = append(names, dl.Name)
	}
	if members != "" {
		names = append(names, strings.Split(members[1:], ".")...)
	}
	if len(names) == 0 {
		return nil // [pkg]: the package exists
	}
	_, err = lookup(pkg, names...)
	return err
}

// docComments returns the doc comments of f: the package clause's, and those of its
// top-level declarations, their specs, and the fields and methods of the types they
// declare. Comments inside function bodies are not doc comments.
func docComments(f *ast.File) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	add := func(cg *ast.CommentGroup) {
		if cg != nil {
			docs = append(docs, cg)
		}
	}
	add(f.Doc)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			add(d.Doc)
		case *ast.GenDecl:
			add(d.Doc)
			ast.Inspect(d, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.TypeSpec:
					add(n.Doc)
				case *ast.ValueSpec:
					add(n.Doc)
				case *ast.Field:
					add(n.Doc)
				case *ast.FuncLit:
					return false
				}
				return true
			})
		}
	}
	return docs
}

// link is a doc link and the plain text right after it.
type link struct {
	*comment.DocLink
	after string
}

// docLinks returns the doc links of a parsed comment, in order.
func docLinks(d *comment.Doc) []link {
	var links []link
	var texts func([]comment.Text)
	texts = func(ts []comment.Text) {
		for i, t := range ts {
			switch t := t.(type) {
			case *comment.DocLink:
				l := link{DocLink: t}
				if i+1 < len(ts) {
					if p, ok := ts[i+1].(comment.Plain); ok {
						l.after = string(p)
					}
				}
				links = append(links, l)
			case *comment.Link:
				texts(t.Text)
			}
		}
	}
	var blocks func([]comment.Block)
	blocks = func(bs []comment.Block) {
		for _, b := range bs {
			switch b := b.(type) {
			case *comment.Paragraph:
				texts(b.Text)
			case *comment.Heading:
				texts(b.Text)
			case *comment.List:
				for _, item := range b.Items {
					blocks(item.Content)
				}
			}
		}
	}
	blocks(d.Content)
	return links
}

// plainText returns the text of a link as written.
func plainText(ts []comment.Text) string {
	var b strings.Builder
	for _, t := range ts {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		}
	}
	return b.String()
}

// cursor finds the positions of a comment's links in its source, in order, so that a
// link repeated in one comment is reported at each of its lines.
type cursor struct {
	fset *token.FileSet
	cg   *ast.CommentGroup
	i    int // the comment (line) searched from
	off  int // the offset in it searched from
}

func (c *cursor) find(s string) token.Position {
	for ; c.i < len(c.cg.List); c.i, c.off = c.i+1, 0 {
		cm := c.cg.List[c.i]
		if j := strings.Index(cm.Text[c.off:], s); j >= 0 {
			at := c.off + j
			c.off = at + len(s)
			pos := c.fset.Position(cm.Slash)
			pos.Line += strings.Count(cm.Text[:at], "\n")
			pos.Column = 0
			return pos
		}
	}
	c.i = 0 // not found as written (split across lines): report the comment's start
	return c.fset.Position(c.cg.Pos())
}

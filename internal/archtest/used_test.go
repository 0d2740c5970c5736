package archtest

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// usedPackages are the packages every exported name of which a test or an example of
// the library uses: a name no test touches is a name no test keeps working.
var usedPackages = []string{"ledger", "saga", "inbox", "outbox"}

// otherModules are the directories of modules of their own, and tools/, whose tests do
// not count: the library's own tests and examples must use its names.
var otherModules = []string{"cmd", "samples", "monitoring", "tools", "agent/mcpguard"}

// testUses is what the library's test files name: for each package, the names they
// select from it (ledger.Do) or, in the package's own internal tests, use bare; and
// every name selected from anything (x.Purge), which counts for methods, since telling
// which type a selector's operand has needs type checking.
type testUses struct {
	names     map[string]map[string]bool // package -> name
	selectors map[string]bool
}

func scanTests(t *testing.T, root string) testUses {
	t.Helper()
	u := testUses{names: map[string]map[string]bool{}, selectors: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if slices.Contains(otherModules, rel) || (rel != "." && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imports := map[string]string{} // local name -> package, for this module's packages
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, mod) {
				continue
			}
			p = strings.TrimPrefix(p, mod)
			name := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = p
		}
		own := filepath.ToSlash(filepath.Dir(rel)) // an internal test's package
		if f.Name.Name != filepath.Base(own) {
			own = ""
		}
		mark := func(pkg, name string) {
			if u.names[pkg] == nil {
				u.names[pkg] = map[string]bool{}
			}
			u.names[pkg][name] = true
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				u.selectors[n.Sel.Name] = true
				if x, ok := n.X.(*ast.Ident); ok {
					if p, ok := imports[x.Name]; ok {
						mark(p, n.Sel.Name)
					}
				}
			case *ast.Ident:
				if own != "" {
					mark(own, n.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// exported lists a package's exported top-level names and its exported types'
// exported methods (as Type.Method), from its non-test files, and for each type the
// names of its exported fields and methods.
func exported(t *testing.T, dir string) (top, methods []string, members map[string][]string) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	// The package's files by package name (a directory holds one, but say so if not).
	pkgs := map[string][]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
	}
	members = map[string][]string{}
	for name, files := range pkgs {
		d, err := doc.NewFromFiles(fset, files, mod+name)
		if err != nil {
			t.Fatal(err)
		}
		values := func(vs []*doc.Value) {
			for _, v := range vs {
				for _, n := range v.Names {
					if ast.IsExported(n) {
						top = append(top, n)
					}
				}
			}
		}
		values(d.Consts)
		values(d.Vars)
		for _, f := range d.Funcs {
			top = append(top, f.Name)
		}
		for _, typ := range d.Types {
			top = append(top, typ.Name)
			if st, ok := typ.Decl.Specs[0].(*ast.TypeSpec).Type.(*ast.StructType); ok {
				for _, f := range st.Fields.List {
					for _, n := range f.Names {
						if n.IsExported() {
							members[typ.Name] = append(members[typ.Name], n.Name)
						}
					}
				}
			}
			values(typ.Consts)
			values(typ.Vars)
			for _, f := range typ.Funcs {
				top = append(top, f.Name)
			}
			for _, m := range typ.Methods {
				methods = append(methods, typ.Name+"."+m.Name)
				members[typ.Name] = append(members[typ.Name], m.Name)
			}
		}
	}
	return top, methods, members
}

// Every exported name of the packages in usedPackages is used by a test or an
// example of the library: a top-level name selected from its package (or used in the
// package's internal tests), a type also by one of its fields or methods, and a method
// by its name on anything.
func TestExportedNamesAreTested(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	uses := scanTests(t, root)
	for _, pkg := range usedPackages {
		top, methods, members := exported(t, filepath.Join(root, pkg))
		for _, n := range top {
			if !uses.names[pkg][n] && !slices.ContainsFunc(members[n], func(m string) bool { return uses.selectors[m] }) {
				t.Errorf("%s.%s is used by no test or example of the library: test it, or unexport it", pkg, n)
			}
		}
		for _, m := range methods {
			if !uses.selectors[m[strings.Index(m, ".")+1:]] {
				t.Errorf("%s.%s is called by no test or example of the library: test it, or unexport it", pkg, m)
			}
		}
		t.Logf("%s: %d top-level names, %d methods", pkg, len(top), len(methods))
	}
}

package archtest

import (
	"fmt"
	"go/ast"
	"go/types"
	"sort"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// A mention is a Go identifier named in text: qualified by a package name
// (ledger.DoOpts.Mode, (*ledger.Ledger).Do), unqualified (DoOpts.Mode), or a lone name.
type mention struct {
	at     int      // byte offset in the scanned text
	text   string   // as written, for messages
	pkg    string   // the package name; "" when unqualified
	names  []string // the identifier, then its fields or methods
	prefix bool     // followed by "*": the last name is the prefix of some names
	call   bool     // followed by "(": it must be a function or a type
	single bool     // a call where one value is expected: after "=" with one operand on its left, or after ":"
}

// scanMentions finds the mentions in s: every chain of identifiers joined by dots that
// starts a word (so oncekit.ledger.calls and go.temporal.io/sdk/worker.New are one
// chain each, not a mention of ledger or worker). A chain qualified by a lower-case
// first element names that package's exported identifier and its exported members; one
// whose first element is capitalized names a type and its members; the chain ends at the
// first element that is not exported. With skipBracket, a chain right after "[" is left
// out (a doc link, checked as one).
func scanMentions(s string, skipBracket bool) []mention {
	var out []mention
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !isIdentStart(r) {
			i += size
			continue
		}
		prev, _ := utf8.DecodeLastRuneInString(s[:i])
		start := i
		var parts []string
		for {
			j := i
			for j < len(s) {
				r, n := utf8.DecodeRuneInString(s[j:])
				if !isIdentStart(r) && !unicode.IsDigit(r) {
					break
				}
				j += n
			}
			parts = append(parts, s[i:j])
			i = j
			if i+1 < len(s) && s[i] == '.' {
				if r, _ := utf8.DecodeRuneInString(s[i+1:]); isIdentStart(r) {
					i++
					continue
				}
			}
			break
		}
		if unicode.IsDigit(prev) || strings.ContainsRune("./-@#$~'\\", prev) || (skipBracket && prev == '[') {
			continue
		}
		from, end := start, i
		// (*pkg.Type).Method and (pkg.Type).Method name a method.
		if open := strings.HasSuffix(s[:start], "(*") || strings.HasSuffix(s[:start], "("); open {
			if strings.HasPrefix(s[end:], ").") {
				j := end + 2
				for j < len(s) {
					r, n := utf8.DecodeRuneInString(s[j:])
					if !isIdentStart(r) && !unicode.IsDigit(r) {
						break
					}
					j += n
				}
				if j > end+2 {
					parts = append(parts, s[end+2:j])
					end, i = j, j
					from = strings.LastIndex(s[:start], "(")
				}
			}
		}
		mn := mention{at: from, text: s[from:end]}
		if !isExported(parts[0]) {
			mn.pkg, parts = parts[0], parts[1:]
		}
		cut := len(parts)
		for k, p := range parts {
			if !isExported(p) {
				cut = k
				break
			}
		}
		if cut == 0 {
			continue
		}
		mn.names = parts[:cut]
		if cut == len(parts) && end < len(s) && s[end] == '*' {
			mn.prefix = true
		}
		if cut == len(parts) && end < len(s) && s[end] == '(' {
			mn.call = true
			mn.single = oneValue(s[:start])
		}
		out = append(out, mn)
	}
	return out
}

// oneValue reports whether an expression that follows before is expected to be one
// value: the right side of an assignment with one operand on its left, or what follows
// a composite literal's key.
func oneValue(before string) bool {
	b := strings.TrimRight(before, " \t\n")
	switch {
	case strings.HasSuffix(b, ":="):
		b = b[:len(b)-2]
	case strings.HasSuffix(b, "=") && !strings.HasSuffix(b, "==") && !strings.ContainsAny(b[max(len(b)-2, 0):len(b)-1], "!<>"):
		b = b[:len(b)-1]
	case strings.HasSuffix(b, ":"):
		return true
	default:
		return false
	}
	lhs := b[strings.LastIndexAny(b, ";{(\n")+1:]
	return !strings.Contains(lhs, ",")
}

func isIdentStart(r rune) bool { return r == '_' || unicode.IsLetter(r) }

func isExported(name string) bool {
	r, _ := utf8.DecodeRuneInString(name)
	return unicode.IsUpper(r)
}

// candidates returns the import paths a package name can mean in the project's text, in
// the order they are tried. This is the rule for names that Temporal's SDK shares with
// oncekit (activity, worker, testsuite) and for every other package a text names:
//
//  1. oncekit's own package of that name;
//  2. Temporal's package of that name (go.temporal.io/sdk/<name>), so that prose about
//     Temporal's worker.New or activity.GetMetricsHandler is checked against Temporal;
//  3. every package that a Go file of the module, tests included, imports under that
//     name, alias or package name (tworker, tactivity, client, workflow, pgx, http, ...).
//
// A mention is correct when any of them has the identifier. A name none of them means
// (a variable such as call.DownstreamKey) is not checked.
func (m *module) candidates(name string) []string {
	m.namesOnce.Do(m.indexNames)
	return m.byName[name]
}

// indexNames fills byName, for candidates.
func (m *module) indexNames() {
	m.byName = map[string][]string{}
	add := func(name, path string) {
		for _, p := range m.byName[name] {
			if p == path {
				return
			}
		}
		m.byName[name] = append(m.byName[name], path)
	}
	for name, path := range m.publicByName() {
		add(name, path)
	}
	var names []string
	imported := map[string][]string{}
	for _, sp := range m.pkgs {
		for _, f := range append(append([]*ast.File(nil), sp.files...), sp.tests...) {
			for _, spec := range f.Imports {
				if name, path := m.importName(spec); name != "" {
					if _, ok := imported[name]; !ok {
						names = append(names, name)
					}
					imported[name] = append(imported[name], path)
				}
			}
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if m.name("go.temporal.io/sdk/"+name) == name {
			add(name, "go.temporal.io/sdk/"+name)
		}
	}
	for _, name := range names {
		paths := imported[name]
		sort.Strings(paths)
		for _, path := range paths {
			add(name, path)
		}
	}
}

// checkQualified checks a mention qualified by a package name against the import
// paths that name can mean. It returns checked == false when the name means no package.
func (m *module) checkQualified(mn mention, paths []string) (checked bool, err error) {
	if len(paths) == 0 {
		return false, nil
	}
	var errs []string
	for _, path := range paths {
		pkg, err := m.pkg(path)
		if err != nil {
			errs = append(errs, fmt.Sprintf("cannot load %s: %v", path, err))
			continue
		}
		if mn.prefix && len(mn.names) == 1 {
			if hasPrefixed(pkg, mn.names[0]) {
				return true, nil
			}
			errs = append(errs, fmt.Sprintf("%s has no exported identifier that starts with %s", path, mn.names[0]))
			continue
		}
		obj, err := lookup(pkg, mn.names...)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		return true, checkUse(mn, obj)
	}
	return true, fmt.Errorf("%s", strings.Join(errs, "; "))
}

// hasPrefixed reports whether pkg has an exported identifier that starts with prefix.
func hasPrefixed(pkg *types.Package, prefix string) bool {
	for _, name := range pkg.Scope().Names() {
		if strings.HasPrefix(name, prefix) && isExported(name) {
			return true
		}
	}
	return false
}

// checkUse checks that a call mention calls something callable, and that a call used
// as one value returns one.
func checkUse(mn mention, obj types.Object) error {
	if !mn.call {
		return nil
	}
	var sig *types.Signature
	switch o := obj.(type) {
	case *types.TypeName:
		return nil // a conversion
	case *types.Func:
		sig = o.Signature()
	default:
		s, ok := obj.Type().Underlying().(*types.Signature)
		if !ok {
			return fmt.Errorf("%s is a %s, not a function", mn.text, kind(obj))
		}
		sig = s
	}
	if mn.single && sig.Results().Len() != 1 {
		results := types.TypeString(sig.Results(), func(p *types.Package) string { return p.Name() })
		return fmt.Errorf("%s returns %d values %s, so it cannot stand where one value is expected", mn.text, sig.Results().Len(), results)
	}
	return nil
}

// known returns every package the project's texts can name: oncekit's and those the
// module imports, for mentions that name no package.
func (m *module) known() []*types.Package {
	m.knownOnce.Do(func() {
		m.namesOnce.Do(m.indexNames)
		seen := map[string]bool{}
		var paths []string
		for _, ps := range m.byName {
			for _, p := range ps {
				if !seen[p] {
					seen[p] = true
					paths = append(paths, p)
				}
			}
		}
		sort.Strings(paths)
		for _, p := range paths {
			if pkg, err := m.pkg(p); err == nil {
				m.knownPkgs = append(m.knownPkgs, pkg)
			}
		}
	})
	return m.knownPkgs
}

// checkUnqualified checks a mention that names no package against every known package:
// a lone name must be an exported identifier, or a field or method of an exported type,
// somewhere; Type.Member must be a member of some package's exported Type.
func (m *module) checkUnqualified(mn mention) error {
	declared := false
	for _, pkg := range m.known() {
		if len(mn.names) == 1 {
			if obj := pkg.Scope().Lookup(mn.names[0]); obj != nil && obj.Exported() {
				return nil
			}
			if memberOfSome(pkg, mn.names[0]) {
				return nil
			}
			continue
		}
		obj := pkg.Scope().Lookup(mn.names[0])
		if obj == nil || !obj.Exported() {
			continue
		}
		declared = true
		if obj, err := lookup(pkg, mn.names...); err == nil {
			return checkUse(mn, obj)
		}
	}
	if len(mn.names) == 1 {
		return fmt.Errorf("no package of oncekit or of its imports declares %s, as an identifier or a field or method", mn.names[0])
	}
	if declared {
		return fmt.Errorf("no %s of oncekit or of its imports has %s", mn.names[0], strings.Join(mn.names[1:], "."))
	}
	return fmt.Errorf("no package of oncekit or of its imports declares %s", mn.names[0])
}

// memberOfSome reports whether an exported type of pkg has a field or method name.
func memberOfSome(pkg *types.Package, name string) bool {
	scope := pkg.Scope()
	for _, n := range scope.Names() {
		tn, ok := scope.Lookup(n).(*types.TypeName)
		if !ok || !tn.Exported() {
			continue
		}
		if obj, _, _ := types.LookupFieldOrMethod(tn.Type(), true, pkg, name); obj != nil {
			return true
		}
	}
	return false
}

// Every identifier that the module's doc comments name in their prose exists, besides
// the doc links TestDocLinksResolve checks: go doc shows the prose, and a stale name in
// it misleads as much as a broken link.
//
// A mention is a chain such as ledger.DoOpts.Mode, (*ledger.Ledger).Do, or DoOpts.Mode
// (see scanMentions); URLs and dotted names such as oncekit.ledger.calls are not. A
// qualified mention's package is the import of that name in the comment's file, else
// in its package, else what candidates returns for the name; a mention qualified by the
// package's own name is checked against the package first. A name that means no
// package (a variable, such as call.DownstreamKey) is not checked. An unqualified
// Type.Member is checked when the comment's package declares Type (a type of another
// package, such as Temporal's Options.Plugins, is not).
func TestDocCommentMentionsExist(t *testing.T) {
	t.Parallel()
	m := loadModule(t)
	checked := 0
	for _, sp := range m.pkgs {
		if len(sp.files) == 0 {
			continue // only tests
		}
		own, err := m.pkg(sp.path)
		if err != nil {
			t.Fatalf("%s: %v", sp.path, err)
		}
		pkgImports := map[string][]string{}
		for _, f := range sp.files {
			for _, spec := range f.Imports {
				if name, path := m.importName(spec); name != "" {
					pkgImports[name] = append(pkgImports[name], path)
				}
			}
		}
		for _, f := range sp.files {
			fileImports := map[string]string{}
			for _, spec := range f.Imports {
				if name, path := m.importName(spec); name != "" {
					fileImports[name] = path
				}
			}
			for _, cg := range docComments(f) {
				for _, c := range cg.List {
					for _, mn := range scanMentions(c.Text, true) {
						pos := m.fset.Position(c.Slash)
						pos.Line += strings.Count(c.Text[:mn.at], "\n")
						pos.Column = 0
						var err error
						switch {
						case mn.pkg == sp.name:
							// The package itself, then what else the name means:
							// activity.GetMetricsHandler in package activity is Temporal's.
							checked++
							_, err = m.checkQualified(mn, append([]string{sp.path}, m.candidates(mn.pkg)...))
						case mn.pkg != "":
							var paths []string
							if path, ok := fileImports[mn.pkg]; ok {
								paths = []string{path}
							} else if ps := pkgImports[mn.pkg]; len(ps) > 0 {
								paths = ps
							} else {
								paths = m.candidates(mn.pkg)
							}
							var ok bool
							if ok, err = m.checkQualified(mn, paths); ok {
								checked++
							}
						case len(mn.names) > 1:
							if tn, ok := own.Scope().Lookup(mn.names[0]).(*types.TypeName); ok && tn.Exported() {
								checked++
								_, err = m.checkQualified(mn, []string{sp.path})
							}
						}
						if err != nil {
							t.Errorf("%s: %s: %v", pos, mn.text, err)
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no identifier found in the module's doc comments: the checker is broken")
	}
	t.Logf("%d identifiers named in doc comments checked", checked)
}

package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// listed is what go list says about one package.
type listed struct {
	ImportPath   string
	Name         string
	Dir          string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	Export       string
	Standard     bool
	DepOnly      bool
	Error        *struct{ Err string }
}

// sourcePkg is one of the module's packages, parsed with its comments.
type sourcePkg struct {
	path  string
	name  string
	dir   string
	files []*ast.File
	tests []*ast.File // the package's test files, imports only
}

// module is the module's packages and everything they import, loaded once for the
// documentation checks: each package's sources parsed, and the exported API of any
// package read from the export data go list -export leaves in the build cache, so
// nothing needs the network.
type module struct {
	root string
	fset *token.FileSet
	pkgs []*sourcePkg // the module's packages, sorted by import path

	mu     sync.Mutex // guards what follows: go/types importers are not safe for concurrent use
	listed map[string]*listed
	imp    types.Importer
	loaded map[string]*types.Package
	failed map[string]error

	namesOnce sync.Once
	byName    map[string][]string // for candidates
	knownOnce sync.Once
	knownPkgs []*types.Package // for known
}

var (
	loadOnce   sync.Once
	loadedMod  *module
	errLoadMod error
)

// loadModule returns the module, loading it on the first call.
func loadModule(t *testing.T) *module {
	t.Helper()
	loadOnce.Do(func() { loadedMod, errLoadMod = newModule() })
	if errLoadMod != nil {
		t.Fatal(errLoadMod)
	}
	return loadedMod
}

func newModule() (*module, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return nil, err
	}
	m := &module{
		root:   root,
		fset:   token.NewFileSet(),
		listed: map[string]*listed{},
		loaded: map[string]*types.Package{},
		failed: map[string]error{},
	}
	all, err := m.goList("-deps", "./...")
	if err != nil {
		return nil, err
	}
	// The samples are a module of their own beside the library's, which the guides
	// name too.
	samples, err := m.goListIn(filepath.Join(root, samplesDir), "-deps", "./...")
	if err != nil {
		return nil, err
	}
	for _, p := range samples {
		if !slices.ContainsFunc(all, func(q *listed) bool { return q.ImportPath == p.ImportPath }) {
			all = append(all, p)
		}
	}
	for _, p := range all {
		m.listed[p.ImportPath] = p
		if p.DepOnly || !strings.HasPrefix(p.ImportPath+"/", mod) {
			continue
		}
		sp := &sourcePkg{path: p.ImportPath, name: p.Name, dir: p.Dir}
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(m.fset, filepath.Join(p.Dir, name), nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return nil, err
			}
			sp.files = append(sp.files, f)
		}
		for _, name := range append(p.TestGoFiles, p.XTestGoFiles...) {
			f, err := parser.ParseFile(m.fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			sp.tests = append(sp.tests, f)
		}
		m.pkgs = append(m.pkgs, sp)
	}
	sort.Slice(m.pkgs, func(i, j int) bool { return m.pkgs[i].path < m.pkgs[j].path })
	// What only tests import (testify, Temporal's testsuite) is not among ./...'s
	// dependencies: list it in one more call rather than one call per package.
	var more []string
	for _, sp := range m.pkgs {
		for _, f := range sp.tests {
			for _, spec := range f.Imports {
				path := strings.Trim(spec.Path.Value, `"`)
				if _, ok := m.listed[path]; !ok && !slices.Contains(more, path) {
					more = append(more, path)
				}
			}
		}
	}
	if len(more) > 0 {
		extra, err := m.goListIn(filepath.Join(root, samplesDir), append([]string{"-deps"}, more...)...)
		if err != nil {
			return nil, err
		}
		for _, p := range extra {
			if _, ok := m.listed[p.ImportPath]; !ok {
				m.listed[p.ImportPath] = p
			}
		}
	}
	m.imp = importer.ForCompiler(m.fset, "gc", m.exportData)
	return m, nil
}

// goList runs go list -export in the module's root and decodes its packages.
func (m *module) goList(args ...string) ([]*listed, error) { return m.goListIn(m.root, args...) }

// samplesDir is the directory of the samples' module.
const samplesDir = "samples"

// goListIn is goList run in dir, the directory of another module of the repository.
func (m *module) goListIn(dir string, args ...string) ([]*listed, error) {
	cmd := exec.Command("go", append([]string{"list", "-e", "-export", "-json=ImportPath,Name,Dir,GoFiles,TestGoFiles,XTestGoFiles,Export,Standard,DepOnly,Error"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	var pkgs []*listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(listed)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
}

// exportData opens the export data of path, asking go list for a package outside the
// module's dependencies (one a doc link names by its full import path).
func (m *module) exportData(path string) (io.ReadCloser, error) {
	p, ok := m.listed[path]
	if !ok {
		more, err := m.goList(path)
		if err != nil {
			return nil, err
		}
		for _, q := range more {
			m.listed[q.ImportPath] = q
		}
		if p, ok = m.listed[path]; !ok {
			return nil, fmt.Errorf("go list does not know package %s", path)
		}
	}
	if p.Error != nil {
		return nil, errors.New(p.Error.Err)
	}
	if p.Export == "" {
		return nil, fmt.Errorf("no export data for %s", path)
	}
	return os.Open(p.Export)
}

// pkg returns the exported API of the package at path.
func (m *module) pkg(path string) (*types.Package, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.loaded[path]; ok {
		return p, nil
	}
	if err, ok := m.failed[path]; ok {
		return nil, err
	}
	p, err := m.imp.Import(path)
	if err != nil {
		m.failed[path] = err
		return nil, err
	}
	m.loaded[path] = p
	return p, nil
}

// name returns the package name of the package at path as go list reports it, or "".
func (m *module) name(path string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.listed[path]; ok {
		return p.Name
	}
	return ""
}

// public reports whether a module package is part of oncekit's API or samples, as
// opposed to internal/, tools/ and commands.
func (sp *sourcePkg) public() bool {
	rel := strings.TrimPrefix(sp.path, mod)
	return sp.name != "main" && !strings.HasPrefix(rel, "internal/") && !strings.HasPrefix(rel, "tools/") &&
		sp.path+"/" != mod
}

// publicByName maps the package name of each public module package to its import path.
func (m *module) publicByName() map[string]string {
	byName := map[string]string{}
	for _, sp := range m.pkgs {
		if sp.public() {
			byName[sp.name] = sp.path
		}
	}
	return byName
}

// importName is the name a file refers to an import by: its alias, or the imported
// package's name. It is "" for blank and dot imports.
func (m *module) importName(spec *ast.ImportSpec) (name, path string) {
	path = strings.Trim(spec.Path.Value, `"`)
	if spec.Name != nil {
		if spec.Name.Name == "_" || spec.Name.Name == "." {
			return "", path
		}
		return spec.Name.Name, path
	}
	if n := m.name(path); n != "" {
		return n, path
	}
	return path[strings.LastIndex(path, "/")+1:], path
}

// lookup finds the member chain names[1:] of the package-level object names[0] in pkg:
// a field or method (promoted ones too) of a type, or of a variable's type. It returns
// the last object found and, when the chain breaks, which part is missing.
func lookup(pkg *types.Package, names ...string) (types.Object, error) {
	obj := pkg.Scope().Lookup(names[0])
	if obj == nil || !obj.Exported() {
		return nil, fmt.Errorf("%s has no exported %s", pkg.Path(), names[0])
	}
	for i, name := range names[1:] {
		var typ types.Type
		switch o := obj.(type) {
		case *types.TypeName, *types.Var, *types.Const:
			typ = o.Type()
		default:
			return nil, fmt.Errorf("%s.%s is a %s, which has no member %s", pkg.Name(), strings.Join(names[:i+1], "."), kind(obj), name)
		}
		next, _, _ := types.LookupFieldOrMethod(typ, true, pkg, name)
		if next == nil {
			return nil, fmt.Errorf("%s.%s has no field or method %s", pkg.Name(), strings.Join(names[:i+1], "."), name)
		}
		obj = next
	}
	return obj, nil
}

// kind names an object's kind for messages.
func kind(obj types.Object) string {
	switch o := obj.(type) {
	case *types.Func:
		if o.Signature().Recv() != nil {
			return "method"
		}
		return "function"
	case *types.TypeName:
		return "type"
	case *types.Const:
		return "constant"
	case *types.Var:
		return "variable"
	}
	return "name"
}

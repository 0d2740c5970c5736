// Package archtest checks the dependency rules between oncekit's packages, and that the
// documentation names only what exists: doc links, identifiers in doc comments, and the
// identifiers, commands and links of the README and the guides in docs/.
package archtest

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/oncekit/oncekit/"

// rules lists, for every public package, what it must not depend on: workflow-side
// packages (saga, keys, policy) import neither pgx nor the ledger; the ledger and the
// packages built only on it import no Temporal package, so a service without Temporal
// does not pull it in; no library package, and no sample, imports the test helpers.
var rules = map[string][]string{
	"keys":                  {"github.com/jackc/pgx", mod + "ledger", "go.temporal.io/", mod + "testsuite"},
	"saga":                  {"github.com/jackc/pgx", mod + "ledger", mod + "testsuite"},
	"policy":                {"github.com/jackc/pgx", mod + "ledger", mod + "testsuite"},
	"ledger":                {"go.temporal.io/", mod + "testsuite"},
	"shard":                 {"go.temporal.io/", mod + "ledger", mod + "testsuite"},
	"idempotency":           {"go.temporal.io/", mod + "testsuite"},
	"webhook":               {"go.temporal.io/", mod + "testsuite"},
	"inbox":                 {"go.temporal.io/", mod + "testsuite"},
	"outbox":                {"go.temporal.io/", mod + "testsuite"},
	"agent":                 {"go.temporal.io/", mod + "testsuite", mod + "activity", mod + "worker"},
	"agent/agenttemporal":   {mod + "testsuite", mod + "worker"},
	"cmd/oncekit":           {"go.temporal.io/", mod + "testsuite", mod + "activity", mod + "worker"}, // its own module, checked from its directory
	"migrate":               {"go.temporal.io/", mod + "testsuite"},
	"monitoring":            {"go.temporal.io/", mod + "testsuite"}, // its own module, tests alone: the dashboard's and the alerts' checks
	"outbox/outboxtemporal": {mod + "testsuite", mod + "worker", mod + "activity"},
	"activity":              {mod + "testsuite", mod + "worker"},
	"worker":                {mod + "testsuite"},
	"testsuite":             {mod + "samples"},
	"devenv":                {mod + "testsuite", mod + "samples", mod + "ledger"},
	"samples/payment":       {mod + "samples/transfer", mod + "testsuite"},
	"samples/transfer":      {mod + "samples/payment", mod + "testsuite"},
	"samples/quickstart":    {mod + "samples/payment", mod + "samples/transfer", mod + "testsuite", mod + "devenv"}, // the public packages alone
	"samples/agent":         {mod + "samples/payment", mod + "testsuite"},                                           // its own module, checked from its directory

	"samples/transfer/worker": {mod + "samples/payment", mod + "testsuite"},
	"samples/transfer/start":  {mod + "samples/payment", mod + "testsuite"},
}

func TestDependencyRules(t *testing.T) {
	t.Parallel()
	for pkg, forbidden := range rules {
		cmd := exec.Command("go", "list", "-deps", mod+pkg)
		// The modules of their own are checked from their directories.
		switch {
		case pkg == "cmd/oncekit" || pkg == "agent/mcpguard" || pkg == "samples/agent":
			cmd.Dir = filepath.Join("..", "..", pkg)
		case strings.HasPrefix(pkg, "samples/"):
			cmd.Dir = filepath.Join("..", "..", "samples")
		case pkg == "monitoring":
			cmd.Dir = filepath.Join("..", "..", "monitoring")
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			// No library package or sample imports the commands in tools/.
			for _, f := range append(forbidden, mod+"tools") {
				if dep == f || strings.HasPrefix(dep, f+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

// Every public package has a rule, so a new package cannot slip past the check.
func TestEveryPackageHasARule(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(pkg, mod)
		if strings.HasPrefix(rel, "internal/") || strings.HasPrefix(rel, "tools/") {
			continue
		}
		if _, ok := rules[rel]; !ok {
			t.Errorf("package %s has no dependency rule in internal/archtest", rel)
		}
	}
}

// internal/ holds leaves below the public packages: no internal package imports a public
// one, so the drawing of the house has no arrow pointing up. Commands that import the
// public API live in cmd/ and tools/.
func TestInternalImportsNoPublicPackage(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"internal/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		for _, dep := range fields[1:] {
			if strings.HasPrefix(dep, mod) && !strings.HasPrefix(dep, mod+"internal/") {
				t.Errorf("%s imports %s: internal/ packages must stay below the public ones", fields[0], dep)
			}
		}
	}
}

// What the command and the demo need stays out of the library: no package of this
// module depends on the command's CLI library, and none but the samples on an
// exporter (the payment demo's OTLP export), so a program importing oncekit gets
// neither.
func TestLibraryGetsNoCommandOrExporterDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}`, "./../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/spf13/") {
			t.Errorf("the module depends on %s: the command's dependencies belong in cmd/oncekit's module", dep)
		}
	}
	libs, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(libs)), "\n") {
		fields := strings.Fields(line)
		rel := strings.TrimPrefix(fields[0], mod)
		if strings.HasPrefix(rel, "samples/") || strings.HasPrefix(rel, "tools/") {
			continue
		}
		for _, dep := range fields[1:] {
			if strings.HasPrefix(dep, "go.opentelemetry.io/otel/exporters/") {
				t.Errorf("%s depends on %s: exporters are the application's choice", rel, dep)
			}
		}
	}
}

// libraryRequires is every module the library's go.mod may require directly: what a
// program importing oncekit's packages inherits. The Temporal SDK brings its API types
// and protobuf; testify and the OpenTelemetry SDK serve tests alone. Samples, the
// command and the monitoring checks keep their dependencies in modules of their own.
var libraryRequires = []string{
	"github.com/google/uuid",
	"github.com/jackc/pgx/v5",
	"github.com/stretchr/testify",
	"go.opentelemetry.io/otel",
	"go.opentelemetry.io/otel/metric",
	"go.opentelemetry.io/otel/trace",
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/sdk/metric",
	"go.temporal.io/api",
	"go.temporal.io/sdk",
	"google.golang.org/protobuf",
}

// The library's go.mod stays small: a direct requirement outside libraryRequires fails,
// so a new dependency is a decision, written here and in the README.
func TestLibraryGoModStaysSmall(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-m", "-f", `{{if not .Indirect}}{{if not .Main}}{{.Path}}{{end}}{{end}}`, "all").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	for _, path := range strings.Fields(string(out)) {
		if !slices.Contains(libraryRequires, path) {
			t.Errorf("the library's go.mod requires %s: keep it in the module that needs it (samples, cmd/oncekit, monitoring) or add it to libraryRequires and the README's Dependencies", path)
		}
	}
}

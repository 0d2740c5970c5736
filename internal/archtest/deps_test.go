// Package archtest checks the dependency rules between oncekit's packages.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

// The rules: workflow-side packages (saga, keys) import neither pgx nor the ledger, and
// the ledger (with the packages built only on it) imports no Temporal package, so a
// service without Temporal does not pull it in.
func TestDependencyRules(t *testing.T) {
	t.Parallel()
	const mod = "github.com/oncekit/oncekit/"
	for pkg, forbidden := range map[string][]string{
		"keys":        {"github.com/jackc/pgx", mod + "ledger", "go.temporal.io/"},
		"saga":        {"github.com/jackc/pgx", mod + "ledger"},
		"policy":      {"github.com/jackc/pgx", mod + "ledger"},
		"ledger":      {"go.temporal.io/"},
		"idempotency": {"go.temporal.io/"},
		"webhook":     {"go.temporal.io/"},
		"inbox":       {"go.temporal.io/"},
	} {
		out, err := exec.Command("go", "list", "-deps", mod+pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

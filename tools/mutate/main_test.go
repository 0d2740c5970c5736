package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every known-defect patch still applies to the tree as it is: a patch that no longer
// applies would make make mutate fail on a rename instead of testing a checker.
func TestPatchesApplyToTheTree(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	ms, err := mutants(filepath.Join(root, "internal", "mutants"))
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	for _, m := range ms {
		require.NotEmpty(t, m.defect, "%s has no Defect line", m.name)
		check := exec.Command("patch", "-p1", "--dry-run", "--forward", "--batch", "-i", m.file)
		check.Dir = root
		out, err := check.CombinedOutput()
		require.NoError(t, err, "%s no longer applies:\n%s", m.name, out)
	}
}

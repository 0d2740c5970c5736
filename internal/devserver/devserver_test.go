package devserver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A server that exits during its start, as one whose port another process took, is
// started again (on a new free port), and a last failure says what the server printed.
func TestStartRetriesAServerThatExits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	cli := filepath.Join(dir, "temporal")
	script := "#!/bin/sh\necho \"$@\" >> " + calls + "\necho 'listen tcp: address already in use' >&2\nexit 1\n"
	require.NoError(t, os.WriteFile(cli, []byte(script), 0o755))

	_, err := startCLI(context.Background(), cli, "default", Options{})
	require.ErrorIs(t, err, errExited)
	require.ErrorContains(t, err, "address already in use")
	out, err := os.ReadFile(calls)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, startAttempts)
	for _, l := range lines {
		require.Contains(t, l, "--port ", "each attempt on a free port")
	}
}

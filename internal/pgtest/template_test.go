package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A cluster is a copy of a template initdb made once; a template missing some of its
// files (a cleaner of the temporary directory removed them) is made again, not copied.
func TestInitData_TemplateMadeOnceAndRemadeWhenIncomplete(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keyDir, _, err := serverBinDir(ctx, 0)
	require.NoError(t, err)
	// A cluster's binaries, which the server's user can run (a fetched release's are
	// linked into the cluster's directory).
	c, err := StartCluster(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	binDir := c.BinDir()
	// A root of the test's own, which the server's user may use.
	root, err := os.MkdirTemp("", "oncekit-pgtemplate-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o777))

	start := func(name string) {
		t.Helper()
		dir := filepath.Join(root, name)
		require.NoError(t, os.Mkdir(dir, 0o777))
		require.NoError(t, os.Chmod(dir, 0o777))
		require.NoError(t, initData(ctx, root, keyDir, binDir, filepath.Join(dir, "data"), c.cred))
		cl := &Cluster{dir: dir, dataDir: filepath.Join(dir, "data"), port: 5432, binDir: binDir, cred: c.cred}
		require.NoError(t, cl.Start(ctx))
		defer cl.Stop()
		conn, err := pgx.Connect(ctx, cl.ConnString())
		require.NoError(t, err)
		defer conn.Close(ctx)
		var one int
		require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	}
	templates := func() []string {
		m, err := filepath.Glob(filepath.Join(root, "oncekit-pgtemplate-*"))
		require.NoError(t, err)
		return m
	}

	start("first")
	tmpls := templates()
	require.Len(t, tmpls, 1, "one template, and no half-made one left beside it")
	require.True(t, templateComplete(tmpls[0]))
	made, err := os.Stat(filepath.Join(tmpls[0], "files"))
	require.NoError(t, err)

	start("second")
	again, err := os.Stat(filepath.Join(tmpls[0], "files"))
	require.NoError(t, err)
	require.Equal(t, made.ModTime(), again.ModTime(), "the second cluster is a copy: the template was not made again")

	require.NoError(t, os.Remove(filepath.Join(tmpls[0], "data", "PG_VERSION")))
	require.False(t, templateComplete(tmpls[0]))
	start("third")
	require.Equal(t, tmpls, templates())
	require.True(t, templateComplete(tmpls[0]), "the incomplete template was made again")
}

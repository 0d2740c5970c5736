package migrate

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// A file marked to run outside a transaction is split into its statements at the
// semicolons that end lines, comments dropped; unmarked files are not marked.
func TestLoad_NoTxFileAndItsStatements(t *testing.T) {
	t.Parallel()
	l := Line{Name: "x", Files: fstest.MapFS{
		"001_a.sql": {Data: []byte("CREATE TABLE t (a int);\n")},
		"002_b.sql": {Data: []byte(NoTxMarker + "\n-- a comment; with a semicolon;\nALTER TABLE t\n    ADD COLUMN IF NOT EXISTS b text;\n\n" +
			"CREATE INDEX CONCURRENTLY IF NOT EXISTS t_b_idx\n    ON t (b) WHERE b IS NOT NULL;\n")},
	}}
	files, err := l.Load()
	require.NoError(t, err)
	require.Len(t, files, 2)
	require.False(t, files[0].NoTx)
	require.True(t, files[1].NoTx)
	require.Equal(t, []string{
		"ALTER TABLE t\n    ADD COLUMN IF NOT EXISTS b text;",
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS t_b_idx\n    ON t (b) WHERE b IS NOT NULL;",
	}, statements(files[1].SQL))
	require.NotContains(t, inTx(files[1]), "CONCURRENTLY")
	require.Equal(t, files[0].SQL, inTx(files[0]))

	script, err := Script("s", l)
	require.NoError(t, err)
	require.NotContains(t, script, "CREATE INDEX CONCURRENTLY")
	require.Contains(t, script, "x/002_b.sql runs outside a transaction")
}

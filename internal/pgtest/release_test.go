package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestParseMajor(t *testing.T) {
	t.Parallel()
	for _, r := range Releases {
		major, err := ParseMajor(strconv.Itoa(r.Major))
		require.NoError(t, err)
		require.Equal(t, r.Major, major)
	}
	for _, bad := range []string{"13", "19", "17.2", "seventeen", "-1", strings.Repeat("9", 500)} {
		t.Run(strconv.Quote(bad[:min(len(bad), 10)]), func(t *testing.T) {
			t.Parallel()
			_, err := ParseMajor(bad)
			require.ErrorIs(t, err, ErrUnsupportedVersion)
			var ve *VersionError
			require.ErrorAs(t, err, &ve)
			require.Contains(t, err.Error(), "14, 15, 16, 17, 18")
			require.Contains(t, err.Error(), "leave ONCEKIT_PG_VERSION unset")
			require.Less(t, len(err.Error()), 300, "the input is not echoed whole")
		})
	}
}

// Every release in the table is one npm can fetch and whose digest the registry
// publishes in this notation.
func TestReleasesArePinned(t *testing.T) {
	t.Parallel()
	for i, r := range Releases {
		require.True(t, strings.HasPrefix(r.Package, strconv.Itoa(r.Major)+"."), "release %d: %s", r.Major, r.Package)
		require.True(t, strings.HasPrefix(r.Integrity, "sha512-"), "release %d", r.Major)
		require.Len(t, r.Integrity, len("sha512-")+88, "release %d", r.Major)
		if i > 0 {
			require.Less(t, Releases[i-1].Major, r.Major, "oldest first")
		}
	}
}

// A cluster runs the major ONCEKIT_PG_VERSION names, or the machine's own binaries when
// it is unset.
func TestStartCluster_RunsTheChosenMajor(t *testing.T) {
	t.Parallel()
	want, err := MajorFromEnv()
	require.NoError(t, err)
	if want == 0 {
		want, err = LocalMajor()
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, nil)
	require.NoError(t, err)
	defer c.Close()
	conn, err := pgx.Connect(ctx, c.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var num int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num))
	require.Equal(t, want, num/10000)
	if major, _ := MajorFromEnv(); major != 0 && os.Geteuid() == 0 {
		// Root's cache is out of the postgres user's reach: the cluster has its own links.
		require.Equal(t, filepath.Join(c.Dir(), "server", "bin"), c.BinDir())
	}
	require.True(t, HasLibrary("pg_stat_statements"), "the contrib libraries are found in %s", c.BinDir())
}

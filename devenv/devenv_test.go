package devenv_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/devenv"
)

// A crashed PostgreSQL comes back with every committed row, a killed backend is gone,
// and faults are refused for servers devenv does not own.
func TestEnv_PostgresFaults(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true, Durable: true})
	require.NoError(t, err)
	defer env.Close()
	require.True(t, env.OwnsPostgres())
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE t (n int)`)
	require.NoError(t, err)
	for i := range 3 {
		_, err = conn.Exec(ctx, `INSERT INTO t VALUES ($1)`, i)
		require.NoError(t, err)
		require.NoError(t, env.CrashPostgres(ctx, 100*time.Millisecond), "crash %d", i)
		conn, err = pgx.Connect(ctx, env.DatabaseURL)
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 3, n, "every committed row survived the crashes")

	victim, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	killed, err := env.KillBackend(ctx, func(n int) int { return 0 })
	require.NoError(t, err)
	require.True(t, killed)
	var one int
	errV := victim.QueryRow(ctx, `SELECT 1`).Scan(&one)
	errC := conn.QueryRow(ctx, `SELECT 1`).Scan(&one)
	require.True(t, errV != nil || errC != nil, "one of the two connections was terminated")
	require.ErrorIs(t, env.CrashTemporal(ctx, 0), devenv.ErrNotOwned)
}

// A kept cluster's instructions name the binary of the server that wrote its data, which
// is not the one on PATH when ONCEKIT_PG_VERSION chose another major.
func TestEnv_KeptAtNamesTheServersBinary(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true, Keep: true})
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	var version string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&version))
	require.NoError(t, conn.Close(ctx))
	kept := env.KeptAt()
	require.NoError(t, env.Close())

	m := regexp.MustCompile(`\n  (\S+) -D (\S+)/data `).FindStringSubmatch(kept)
	require.NotNil(t, m, kept)
	t.Cleanup(func() { _ = os.RemoveAll(m[2]) })
	require.True(t, filepath.IsAbs(m[1]), "an absolute path: %s", m[1])
	out, err := exec.Command(m[1], "--version").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), " "+strings.Fields(version)[0], "the binary is the server's own version")
	require.DirExists(t, filepath.Join(m[2], "data"))
}

// Config.Shards starts independent clusters; CrashShard crashes one while the other
// stays up, and what it committed survives.
func TestEnv_Shards(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true, Durable: true, Shards: 2})
	require.NoError(t, err)
	defer env.Close()
	require.Len(t, env.ShardURLs, 2)
	require.Equal(t, env.DatabaseURL, env.ShardURLs[0])
	require.NotEqual(t, env.ShardURLs[0], env.ShardURLs[1])
	conns := make([]*pgx.Conn, 2)
	for i, url := range env.ShardURLs {
		conns[i], err = pgx.Connect(ctx, url)
		require.NoError(t, err)
		_, err = conns[i].Exec(ctx, `CREATE TABLE t (n int); INSERT INTO t VALUES (1)`)
		require.NoError(t, err, "shard %d is a cluster of its own", i)
	}
	done := make(chan error, 1)
	go func() { done <- env.CrashShard(ctx, 1, 2*time.Second) }()
	require.Eventually(t, func() bool { return conns[1].Ping(ctx) != nil }, 5*time.Second, 50*time.Millisecond, "shard 1 went down")
	require.NoError(t, conns[0].Ping(ctx), "shard 0 stays up")
	require.NoError(t, <-done)
	c, err := pgx.Connect(ctx, env.ShardURLs[1])
	require.NoError(t, err)
	defer c.Close(ctx)
	var n int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n))
	require.Equal(t, 1, n)
	require.Error(t, env.CrashShard(ctx, 2, time.Second))
	require.NoError(t, conns[0].Close(ctx))
}

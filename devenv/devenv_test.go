package devenv_test

import (
	"context"
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

package faultproxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// proxied returns a connection in mode to the test server through a proxy with plan,
// and a direct pool on the same schema.
func proxied(t *testing.T, plan faultproxy.Plan, mode pgx.QueryExecMode) (*pgx.Conn, *faultproxy.Proxy, func(string) int) {
	t.Helper()
	pool, schema := pgtest.NewSchema(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE t (id int PRIMARY KEY)`)
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	p := faultproxy.Start(t, pgtest.URL(t), plan)
	p.Route(&cfg.Config)
	cfg.RuntimeParams["search_path"] = schema
	cfg.DefaultQueryExecMode = mode
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	count := func(q string) int {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), q).Scan(&n))
		return n
	}
	return conn, p, count
}

// TestCommitFatal: a COMMIT that ran on the server is answered with FATAL 57P01, in
// every exec mode, whether it travels alone or in a batch.
func TestCommitFatal(t *testing.T) {
	ctx := context.Background()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			conn, p, count := proxied(t, faultproxy.Plan{Seed: 1, CommitFatal: 1}, mode)
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "INSERT INTO t VALUES ($1)", 1)
			require.NoError(t, err)
			err = tx.Commit(ctx)
			require.Error(t, err)
			require.Equal(t, "57P01", pgsql.Code(err), "%v", err)
			require.Equal(t, 1, count("SELECT count(*) FROM t"), "the commit ran on the server")
			require.EqualValues(t, 1, p.Count(faultproxy.CommitFatal))
		})
	}
}

// TestCommitLostInBatch: a batch that ends in COMMIT, its answer dropped: the client
// hears no SQLSTATE, and the batch committed.
func TestCommitLostInBatch(t *testing.T) {
	ctx := context.Background()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			conn, p, count := proxied(t, faultproxy.Plan{Seed: 1, CommitLost: 1}, mode)
			for i := range 2 { // the second time, a cached COMMIT is only bound
				b := &pgx.Batch{}
				b.Queue("BEGIN")
				b.Queue("INSERT INTO t VALUES ($1)", i)
				b.Queue("COMMIT")
				err := conn.SendBatch(ctx, b).Close()
				require.Error(t, err)
				require.Equal(t, "", pgsql.Code(err), "%v", err)
				require.Equal(t, i+1, count("SELECT count(*) FROM t"), "the commit ran on the server")
				require.EqualValues(t, i+1, p.Count(faultproxy.CommitLost))
				cfg := conn.Config()
				conn, err = pgx.ConnectConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close(context.Background()) })
			}
		})
	}
}

// TestCutRollsBack: a connection cut before its COMMIT is forwarded leaves nothing
// committed, and the proxy's faults stay off while it is disabled.
func TestCutRollsBack(t *testing.T) {
	ctx := context.Background()
	conn, p, count := proxied(t, faultproxy.Plan{Seed: 7, Cut: 1}, pgx.QueryExecModeCacheStatement)
	p.SetEnabled(false)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1)")
	require.NoError(t, err)
	p.SetEnabled(true)
	require.Error(t, tx.Commit(ctx))
	require.Equal(t, 0, count("SELECT count(*) FROM t"), "the connection was cut before COMMIT")
	require.EqualValues(t, 1, p.Count(faultproxy.Cut))
}

// TestSyncLost: a statement outside a transaction block commits by itself; with its
// answer lost, the client hears no SQLSTATE and the row is there.
func TestSyncLost(t *testing.T) {
	ctx := context.Background()
	conn, p, count := proxied(t, faultproxy.Plan{Seed: 3}, pgx.QueryExecModeCacheStatement)
	_, err := conn.Exec(ctx, "SELECT 1") // the statement cache and the connection are warm
	require.NoError(t, err)
	p2, err := faultproxy.New("tcp", p.Addr(), faultproxy.Plan{Seed: 3, SyncLost: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p2.Close() })
	cfg := conn.Config()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	p2.Route(&cfg.Config)
	p2.SetEnabled(false)
	conn2, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn2.Close(context.Background()) })
	p2.SetEnabled(true)
	_, err = conn2.Exec(ctx, "INSERT INTO t VALUES ($1)", 5)
	require.Error(t, err)
	require.Equal(t, "", pgsql.Code(err), "%v", err)
	require.Equal(t, 1, count("SELECT count(*) FROM t WHERE id = 5"), "the statement committed by itself")
	require.EqualValues(t, 1, p2.Count(faultproxy.CommitLost))
}

// TestArm: an armed proxy acts once, after the chosen round trip that executes a
// statement, in every exec mode. A cut statement outside a transaction block still
// runs on the server, and so does one whose answers a blackhole drops; Disarm names
// the statement, and Settle waits for the session to end.
func TestArm(t *testing.T) {
	ctx := context.Background()
	for name, act := range map[string]faultproxy.Action{"CutAfter": faultproxy.CutAfter, "Blackhole": faultproxy.Blackhole} {
		for _, mode := range pgtest.ExecModes {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				conn, p, count := proxied(t, faultproxy.Plan{}, mode)
				_, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)")
				require.NoError(t, err)
				p.Arm(act, 2, true)
				_, err = conn.Exec(ctx, "INSERT INTO t VALUES (2)")
				require.NoError(t, err, "the first round trip after Arm is forwarded as usual")
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				_, err = conn.Exec(cctx, "INSERT INTO t VALUES (3)")
				require.Error(t, err, "the answer to the second is lost")
				fired, at := p.Disarm()
				require.True(t, fired)
				require.Contains(t, at, "INSERT INTO t VALUES (3)")
				if act == faultproxy.Blackhole {
					p.CloseConns() // ends the session, whose client no longer listens
				}
				p.Settle(t, pgtest.Pool(t, "public", nil))
				require.Equal(t, 3, count("SELECT count(*) FROM t"), "the statement ran on the server")
				fired, _ = p.Disarm()
				require.False(t, fired, "Disarm forgets what fired")
			})
		}
	}
}

package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// terminate kills the backend serving tx from another connection, as a network drop or
// an operator's pg_terminate_backend would.
func terminate(ctx context.Context, t *testing.T, b *testBundle, tx pgx.Tx) {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1::int)", tx.Conn().PgConn().PID()).Scan(&ok))
	require.True(t, ok)
}

// The connection is killed in the middle of the mutation and again between the mutation
// and the commit: nothing is half-committed, and the retry succeeds exactly once.
func TestDo_ConnectionKilledMidTransaction(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, b := setup(t, nil)
		ctx := context.Background()
		req := order{Item: "tv", Amount: 80000}
		in := intent(t, "acme", "order-tv", req)
		// pg_terminate_backend only signals the backend: until it has exited, its
		// transaction still holds the key. Each call waits for that, as a client that
		// retries with backoff would.
		opts := &ledger.DoOpts{Mode: mode, Wait: 10 * time.Second}

		// Killed after the first write, before the second statement.
		_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			if _, err := createOrder("acme", req)(ctx, tx); err != nil {
				return ledger.Response{}, err
			}
			terminate(ctx, t, b, tx)
			_, err := tx.Exec(ctx, "SELECT 1")
			return ledger.Response{}, err
		}, opts)
		require.Error(t, err)

		// Killed after the mutation returned, so the commit meets a dead connection.
		_, err = l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			resp, err := createOrder("acme", req)(ctx, tx)
			terminate(ctx, t, b, tx)
			return resp, err
		}, opts)
		require.Error(t, err)
		require.Equal(t, 0, countOrders(t, b.pool, "acme"))
		require.Equal(t, 0, countRecords(t, b.pool, b.schema))

		res, err := l.Do(ctx, in, createOrder("acme", req), opts)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		res, err = l.Do(ctx, in, createOrder("acme", req), opts)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 1, countOrders(t, b.pool, "acme"))
	})
}

// PostgreSQL restarts while a mutation is in flight and again between attempts: the
// in-flight attempt leaves nothing behind, the retry runs once, and a completed result
// survives the restart. Not parallel: it restarts the package's cluster.
func TestDo_PostgresRestart(t *testing.T) {
	cluster := pgtest.OwnCluster(t)
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "bike", Amount: 30000}
	in := intent(t, "acme", "order-bike", req)

	_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		resp, err := createOrder("acme", req)(ctx, tx)
		if err != nil {
			return resp, err
		}
		if err := cluster.Restart(ctx); err != nil {
			return resp, err
		}
		_, err = tx.Exec(ctx, "SELECT 1")
		return resp, err
	}, nil)
	require.Error(t, err, "the attempt in flight during the restart fails")
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))

	res1, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.False(t, res1.Replayed)

	require.NoError(t, cluster.Restart(ctx))
	require.Eventually(t, func() bool { return b.pool.Ping(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
	res2, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res2.Replayed)
	require.Equal(t, res1.Body, res2.Body)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

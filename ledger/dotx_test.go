package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/ledger"
)

// DoTx joins the caller's transaction: the record commits or rolls back with it, and a
// failure inside leaves the caller's transaction usable.
func TestDoTx_JoinsCallerTransaction(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "mug", Amount: 800}
	in := intent(t, "acme", "order-mug", req)

	// The caller rolls back: no record, no order.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = l.DoTx(ctx, tx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countRecords(t, b.pool, b.schema))

	// A retryable failure inside DoTx undoes only DoTx's work.
	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO orders (tenant, item, amount) VALUES ('acme', 'callers-own', 1)")
	require.NoError(t, err)
	boom := errors.New("boom")
	_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, _ = createOrder("acme", req)(ctx, tx)
		_, _ = tx.Exec(ctx, "SELECT 1/0") // leaves the transaction aborted
		return ledger.Response{}, boom
	}, nil)
	require.ErrorIs(t, err, boom)
	res, err := l.DoTx(ctx, tx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	replay, err := l.DoTx(ctx, tx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, res.Body, replay.Body)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2, countOrders(t, b.pool, "acme"), "the caller's row and one order")

	// Outside, the committed result replays.
	res2, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res2.Replayed)
	require.Equal(t, res.Body, res2.Body)
}

// DoTx stores a definitive failure and keeps the caller's lock_timeout.
func TestDoTx_DefinitiveFailureAndSettings(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "boat", Amount: 1}
	in := intent(t, "acme", "order-boat", req)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '1234ms'")
	require.NoError(t, err)
	_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, _ = createOrder("acme", req)(ctx, tx)
		return ledger.Response{}, ledger.Definitive("out_of_stock", "no boats")
	}, &ledger.DoOpts{Wait: time.Second})
	var derr *ledger.DefinitiveError
	require.ErrorAs(t, err, &derr)
	var lt string
	require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt))
	require.Equal(t, "1234ms", lt)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
	_, err = l.Do(ctx, in, createOrder("acme", req), nil)
	require.ErrorAs(t, err, &derr)
	require.True(t, derr.Replayed)
}

package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/ledger"
)

// Every …Tx method works inside a transaction the caller holds: its change commits with
// the caller's writes, and rolls back with them.
func TestTxMethods_CallerHeldTransactions(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE `+b.schema+`.charges (key text PRIMARY KEY)`)
	require.NoError(t, err)
	in := intent(t, "acme", "tx-1", order{Item: "card", Amount: 1})
	inTx := func(commit bool, fn func(tx pgx.Tx)) {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		fn(tx)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	state := func(in ledger.Intent) ledger.State {
		t.Helper()
		var rec *ledger.Record
		inTx(false, func(tx pgx.Tx) {
			var err error
			rec, err = l.GetTx(ctx, tx, in.Scope, in.Key)
			require.NoError(t, err)
		})
		return rec.State
	}

	// ClaimTx takes effect when the caller commits.
	var lease *ledger.Lease
	inTx(false, func(tx pgx.Tx) {
		c, err := l.ClaimTx(ctx, tx, in, &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, c.Lease)
	})
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound, "a rolled-back claim left nothing")
	inTx(true, func(tx pgx.Tx) {
		c, err := l.ClaimTx(ctx, tx, in, &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		lease = c.Lease
	})
	require.Equal(t, ledger.StatePending, state(in))

	// ExtendTx and MarkUncertainTx.
	until := lease.Until
	inTx(true, func(tx pgx.Tx) { require.NoError(t, l.ExtendTx(ctx, tx, lease, time.Hour)) })
	require.True(t, lease.Until.After(until))
	inTx(false, func(tx pgx.Tx) { require.NoError(t, l.MarkUncertainTx(ctx, tx, lease)) })
	rec, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.False(t, rec.Uncertain, "a rolled-back mark left the record as it was")
	inTx(true, func(tx pgx.Tx) { require.NoError(t, l.MarkUncertainTx(ctx, tx, lease)) })
	c, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.True(t, c.Lease.Uncertain)
	lease = c.Lease

	// CompleteTx commits with the caller's own row, or not at all.
	inTx(false, func(tx pgx.Tx) {
		_, err := tx.Exec(ctx, `INSERT INTO `+b.schema+`.charges (key) VALUES ($1)`, string(in.Key))
		require.NoError(t, err)
		_, err = l.CompleteTx(ctx, tx, lease, ledger.Response{Body: []byte(`"ch_1"`)})
		require.NoError(t, err)
	})
	require.Equal(t, ledger.StatePending, state(in))
	inTx(true, func(tx pgx.Tx) {
		_, err := tx.Exec(ctx, `INSERT INTO `+b.schema+`.charges (key) VALUES ($1)`, string(in.Key))
		require.NoError(t, err)
		_, err = l.CompleteTx(ctx, tx, lease, ledger.Response{Body: []byte(`"ch_1"`)})
		require.NoError(t, err)
	})
	require.Equal(t, ledger.StateCompleted, state(in))

	// FailTx and ReleaseTx.
	failed := intent(t, "acme", "tx-2", order{Item: "card", Amount: 2})
	c, err = l.Claim(ctx, failed, nil)
	require.NoError(t, err)
	inTx(true, func(tx pgx.Tx) {
		require.NoError(t, l.FailTx(ctx, tx, c.Lease, ledger.Definitive("card_declined", "declined")))
	})
	require.Equal(t, ledger.StateFailed, state(failed))
	released := intent(t, "acme", "tx-3", order{Item: "card", Amount: 3})
	c, err = l.Claim(ctx, released, nil)
	require.NoError(t, err)
	inTx(true, func(tx pgx.Tx) { require.NoError(t, l.ReleaseTx(ctx, tx, c.Lease)) })
	_, err = l.Get(ctx, released.Scope, released.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)

	// PurgeTx deletes expired records with the caller's commit only.
	b.clock.Advance(100 * 24 * time.Hour)
	inTx(false, func(tx pgx.Tx) {
		res, err := l.PurgeTx(ctx, tx, nil)
		require.NoError(t, err)
		require.EqualValues(t, 2, res.Deleted)
	})
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err, "a rolled-back purge deleted nothing")
	inTx(true, func(tx pgx.Tx) {
		res, err := l.PurgeTx(ctx, tx, nil)
		require.NoError(t, err)
		require.EqualValues(t, 2, res.Deleted)
	})
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)
}

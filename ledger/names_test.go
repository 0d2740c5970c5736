package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/ledger"
)

// A pool, a connection and a transaction each begin what the ledger runs in.
var (
	_ ledger.Beginner = (*pgxpool.Pool)(nil)
	_ ledger.Beginner = (*pgx.Conn)(nil)
	_ ledger.Beginner = pgx.Tx(nil)
)

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want any
	}{
		{ledger.OutcomeFirst, "first"}, {ledger.OutcomeReplay, "replay"}, {ledger.OutcomeFailed, "failed"},
		{ledger.OutcomeKeyReused, "key_reused"}, {ledger.OutcomeInProgress, "in_progress"},
		{ledger.OutcomeSnapshotConflict, "snapshot_conflict"}, {ledger.OutcomeRedrive, "redrive"},
		{ledger.OutcomeCompleted, "completed"}, {ledger.OutcomeReleased, "released"},
		{ledger.OutcomeUncertain, "uncertain"}, {ledger.OutcomeLeaseLost, "lease_lost"}, {ledger.OutcomeError, "error"},
		{ledger.MigrationLine, "ledger"},
		{ledger.MaxBodyDefault, 1 << 20},
		{ledger.ListLimitDefault, 100},
		{ledger.PurgeBatchDefault, 1000},
		// PostgreSQL's longest lock_timeout, 2^31-1 ms.
		{ledger.MaxWait, time.Duration(1<<31-1) * time.Millisecond},
	} {
		require.Equal(t, c.want, c.got)
	}
}

// OutcomeOf names what a call returned as the ledger's metrics do.
func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		res  ledger.Result
		err  error
		want string
	}{
		{ledger.Result{}, nil, ledger.OutcomeFirst},
		{ledger.Result{Replayed: true}, nil, ledger.OutcomeReplay},
		{ledger.Result{}, ledger.Definitive("declined", "no"), ledger.OutcomeFailed},
		{ledger.Result{}, &ledger.DefinitiveError{Code: "declined", Replayed: true}, ledger.OutcomeReplay},
		{ledger.Result{}, fmt.Errorf("call: %w", ledger.ErrFingerprintMismatch), ledger.OutcomeKeyReused},
		{ledger.Result{}, ledger.ErrInProgress, ledger.OutcomeInProgress},
		{ledger.Result{}, ledger.ErrSnapshotConflict, ledger.OutcomeSnapshotConflict},
		{ledger.Result{}, errors.New("connection refused"), ledger.OutcomeError},
	} {
		require.Equal(t, c.want, ledger.OutcomeOf(c.res, c.err), "%v", c.err)
	}
}

// A mutation that returns a result although one of its statements failed stores
// nothing: its writes cannot commit, and Do says so.
func TestDo_ResultAfterAbortedStatementIsRefused(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "aborted-1", order{Item: "lamp", Amount: 1})
	_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, _ = tx.Exec(ctx, "SELECT 1/0") // leaves the transaction aborted; the error is dropped
		return ledger.Response{Code: 200}, nil
	}, nil)
	require.ErrorIs(t, err, ledger.ErrTxAborted)
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound, "nothing was stored")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n))
	require.Zero(t, n)
}

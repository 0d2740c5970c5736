package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// Fifty callers of one key at once, in every mode that claims the key before fn's
// first statement runs, and in DoTx: that statement starts once per key, counted by a
// sequence, which does not roll back, and fn is called once where the claim answers
// before fn runs. A claim that tried the key's lock in the statement that also looked
// for its record looked with a snapshot taken before the lock: an attempt that
// committed in between, and then let the lock go, left no record in that snapshot, so
// the first statement ran for a completed key (its writes rolled back at the record's
// primary key; the sequence kept the start).
func TestClaim_TakenKeyNeverStartsTheFirstStatement(t *testing.T) {
	type caller func(ctx context.Context, e *rsEnv, in ledger.Intent, fn ledger.Func, wait time.Duration) (ledger.Result, error)
	do := func(mode ledger.Mode) caller {
		return func(ctx context.Context, e *rsEnv, in ledger.Intent, fn ledger.Func, wait time.Duration) (ledger.Result, error) {
			return e.l.Do(ctx, in, fn, &ledger.DoOpts{Mode: mode, Wait: wait})
		}
	}
	doTx := func(ctx context.Context, e *rsEnv, in ledger.Intent, fn ledger.Func, wait time.Duration) (res ledger.Result, err error) {
		err = pgx.BeginFunc(ctx, e.b.pool, func(tx pgx.Tx) error {
			res, err = e.l.DoTx(ctx, tx, in, fn, &ledger.DoOpts{Wait: wait})
			return err
		})
		return res, err
	}
	for _, tc := range []struct {
		name string
		call caller
		// answered: the claim answers before fn is called, so fn itself runs once.
		answered bool
	}{
		{"ModeClaimWithFirstStatement", do(ledger.ModeClaimWithFirstStatement), false},
		{"ModeClaimFirst", do(ledger.ModeClaimFirst), true},
		{"ModeLookUpFirst", do(ledger.ModeLookUpFirst), true},
		{"DoTx", doTx, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := rsSetup(t, nil)
			rounds := 100
			if testing.Short() {
				rounds = 30
			}
			if pgtest.IsCitus() {
				rounds = 10 // the same claim, at Citus's pace: a round takes a second there
			}
			for round := range rounds {
				wait := ledger.NoWait
				if round%2 == 1 {
					wait = 10 * time.Second
				}
				k := fmt.Sprintf("k-%d", round)
				before := e.started(t)
				var calls atomic.Int64
				fn := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					calls.Add(1)
					var started int64
					if err := tx.QueryRow(ctx, `SELECT nextval('rs_started')`).Scan(&started); err != nil {
						return ledger.Response{}, err
					}
					_, err := tx.Exec(ctx, `INSERT INTO rs_effects (k, started) VALUES ($1, $2)`, k, started)
					return ledger.Response{Code: 200, Body: fmt.Appendf(nil, `{"started":%d}`, started)}, err
				}
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make([]error, 50)
				firsts := make([]bool, 50)
				for i := range 50 {
					wg.Go(func() {
						<-start
						res, err := tc.call(context.Background(), e, rsIn(t, k, "p"), fn, wait)
						errs[i], firsts[i] = err, err == nil && !res.Replayed
					})
				}
				close(start)
				wg.Wait()
				nf := 0
				for i, err := range errs {
					if err != nil {
						require.ErrorIs(t, err, ledger.ErrInProgress, "caller %d", i)
					}
					if firsts[i] {
						nf++
					}
				}
				require.Equal(t, 1, nf, "round %d: one caller ran the mutation", round)
				require.Equal(t, 1, e.rows(t, k), "round %d", round)
				require.Equal(t, before+1, e.started(t), "round %d (wait %v): the first statement started once", round, wait)
				if tc.answered {
					require.Equal(t, int64(1), calls.Load(), "round %d: fn was called once", round)
				}
			}
		})
	}
}

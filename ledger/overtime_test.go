package ledger_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// counted wraps fn and counts how often it was called.
func counted(calls *atomic.Int32, fn ledger.Func) ledger.Func {
	return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		calls.Add(1)
		return fn(ctx, tx)
	}
}

// An expired record that was not purged counts as absent: a late retry is a new intent,
// and the call runs fn once, in every mode, from Do and from DoTx.
func TestDo_ExpiredRecordRunsFnOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, inTx := range []bool{false, true} {
			opts := &ledger.DoOpts{Mode: mode}
			t.Run(modeName(mode)+map[bool]string{false: "Do", true: "DoTx"}[inTx], func(t *testing.T) {
				t.Parallel()
				l, b := setup(t, &ledger.Config{Retention: time.Hour})
				ctx := context.Background()
				req := order{Item: "tea", Amount: 1}
				in := intent(t, "acme", "order-tea", req)
				_, err := l.Do(ctx, in, createOrder("acme", req), nil)
				require.NoError(t, err)
				b.clock.Advance(2 * time.Hour)

				var calls atomic.Int32
				var res ledger.Result
				if inTx {
					tx, err := b.pool.Begin(ctx)
					require.NoError(t, err)
					defer tx.Rollback(ctx)
					res, err = l.DoTx(ctx, tx, in, counted(&calls, createOrder("acme", req)), opts)
					require.NoError(t, err)
					require.NoError(t, tx.Commit(ctx))
				} else {
					res, err = l.Do(ctx, in, counted(&calls, createOrder("acme", req)), opts)
					require.NoError(t, err)
				}
				require.False(t, res.Replayed, "after expiry the retry is a new intent")
				require.Equal(t, int32(1), calls.Load(), "one call runs fn once")
				require.Equal(t, 2, countOrders(t, b.pool, "acme"))
				require.Equal(t, 1, countRecords(t, b.pool, b.schema))
			})
		}
	}
}

// waitForLockWaiters blocks until n sessions wait for an advisory lock. On Citus the
// waits happen on the worker that holds the key's record, which citus_locks shows.
func waitForLockWaiters(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	locks := "pg_locks"
	if pgtest.IsCitus() {
		locks = "citus_locks"
	}
	require.Eventually(t, func() bool {
		var waiting int
		err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM "+locks+" WHERE locktype = 'advisory' AND NOT granted").Scan(&waiting)
		return err == nil && waiting >= n
	}, 30*time.Second, 5*time.Millisecond, "%d callers waiting", n)
}

// A holder whose fn fails hands the key to one waiter, which runs fn; the others replay
// its result, within their wait.
func TestDo_WaitersTakeOverFromFailedHolder(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			_, b := setup(t, nil)
			// Every waiter holds a connection while it waits.
			pool := pgtest.Pool(t, b.schema, func(c *pgxpool.Config) { c.MaxConns = 48 })
			l, err := ledger.New(pool, &ledger.Config{Schema: b.schema, Test: ledger.TestConfig{NowFunc: b.clock.Now}})
			require.NoError(t, err)
			ctx := context.Background()
			req := order{Item: "lamp", Amount: 1}
			in := intent(t, "acme", "order-lamp", req)

			inside, fail := make(chan struct{}), make(chan struct{})
			var failOnce sync.Once
			t.Cleanup(func() { failOnce.Do(func() { close(fail) }) })
			holderErr := make(chan error, 1)
			go func() {
				// The holder claims before fn runs, so the waiters meet a held key.
				_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					close(inside)
					<-fail
					return ledger.Response{}, errors.New("provider unreachable")
				}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
				holderErr <- err
			}()
			<-inside

			const waiters = 40
			opts := ledger.DoOpts{Mode: mode, Wait: 30 * time.Second}
			var calls, replays atomic.Int32
			errs := make(chan error, waiters)
			var wg sync.WaitGroup
			for range waiters {
				wg.Go(func() {
					res, err := l.Do(ctx, in, counted(&calls, createOrder("acme", req)), &opts)
					if err != nil {
						errs <- err
						return
					}
					if res.Replayed {
						replays.Add(1)
					}
				})
			}
			if mode != ledger.ModeOptimistic { // an optimistic attempt takes no claim and does not wait
				waitForLockWaiters(t, b.pool, waiters)
			}
			failOnce.Do(func() { close(fail) })
			require.ErrorContains(t, <-holderErr, "provider unreachable")
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, int32(waiters-1), replays.Load(), "all but one waiter replay")
			require.Equal(t, 1, countOrders(t, b.pool, "acme"), "one waiter ran fn")
		})
	}
}

// DoTx with a claim that travels with fn's first statement, on a key another attempt
// holds, under READ COMMITTED: a refused claim is "in progress", waited for as Wait says,
// never a snapshot conflict; also when fn sends no statement and the claim travels with
// the record.
func TestDoTx_HeldKeyWaitsUnderReadCommitted(t *testing.T) {
	t.Parallel()
	fns := map[string]func(req order) ledger.Func{
		"WithStatements": func(req order) ledger.Func { return createOrder("acme", req) },
		"WithoutStatements": func(req order) ledger.Func {
			return func(context.Context, pgx.Tx) (ledger.Response, error) {
				return ledger.Response{Code: 200, Body: []byte(req.Item)}, nil
			}
		},
	}
	for name, mk := range fns {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, b := setup(t, nil)
			ctx := context.Background()
			req := order{Item: "mug", Amount: 1}
			in := intent(t, "acme", "order-mug", req)

			inside, finish := make(chan struct{}), make(chan struct{})
			var finishOnce sync.Once
			t.Cleanup(func() { finishOnce.Do(func() { close(finish) }) })
			holder := make(chan ledger.Result, 1)
			go func() {
				res, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					resp, err := mk(req)(ctx, tx)
					close(inside)
					<-finish
					return resp, err
				}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
				assertNoError(t, err)
				holder <- res
			}()
			<-inside

			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = l.DoTx(ctx, tx, in, mk(req), &ledger.DoOpts{Mode: ledger.ModeClaimWithFirstStatement})
			require.ErrorIs(t, err, ledger.ErrInProgress, "without a wait the call fails fast")

			got := make(chan error, 1)
			var res ledger.Result
			go func() {
				var err error
				res, err = l.DoTx(ctx, tx, in, mk(req), &ledger.DoOpts{Mode: ledger.ModeClaimWithFirstStatement, Wait: 30 * time.Second})
				got <- err
			}()
			waitForLockWaiters(t, b.pool, 1)
			finishOnce.Do(func() { close(finish) })
			require.NoError(t, <-got)
			first := <-holder
			require.True(t, res.Replayed)
			require.Equal(t, first.Body, res.Body)
			require.NoError(t, tx.Commit(ctx))
		})
	}
}

// fn's first statement fails before PostgreSQL runs it: pgx cannot encode an argument, or
// (in the exec modes that prepare first) the statement names a table that does not
// exist. DoTx returns the statement's error and the caller's transaction stays usable, in
// every exec mode and claim mode, on connections that never ran the statement before.
func TestDoTx_FirstStatementFailsBeforeItRuns(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, b *testBundle) {
		ctx := context.Background()
		statements := map[string]func(ctx context.Context, tx pgx.Tx) error{
			"Unencodable": func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO skus (sku) VALUES ($1)", make(chan int))
				return err
			},
			"Overflow": func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT $1::int4", int64(1)<<40)
				return err
			},
			"UnknownTable": func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO no_such_table (x) VALUES (1)")
				return err
			},
			"UnknownTableQuery": func(ctx context.Context, tx pgx.Tx) error {
				var n int
				return tx.QueryRow(ctx, "SELECT count(*) FROM no_such_table WHERE x = $1", 1).Scan(&n)
			},
		}
		for name, stmt := range statements {
			for _, mode := range modes {
				opts := &ledger.DoOpts{Mode: mode}
				t.Run(name+modeName(mode), func(t *testing.T) {
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer tx.Rollback(ctx)
					mine := "mine-" + t.Name()
					_, err = tx.Exec(ctx, "INSERT INTO skus (sku) VALUES ($1)", mine)
					require.NoError(t, err)
					in := intent(t, "acme", "bad-"+t.Name(), "x")
					_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
						return ledger.Response{}, stmt(ctx, tx)
					}, opts)
					require.Error(t, err)
					_, err = tx.Exec(ctx, "SELECT 1")
					require.NoError(t, err, "the caller's transaction is usable")
					require.NoError(t, tx.Commit(ctx))
					var n int
					require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM skus WHERE sku = $1", mine).Scan(&n))
					require.Equal(t, 1, n, "the caller's earlier write committed")
					require.Equal(t, 0, countKey(t, pool, b.schema, string(in.Key)), "nothing recorded")
				})
			}
		}
	})
}

func countKey(t *testing.T, pool *pgxpool.Pool, schema, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{schema, "idempotency_records"}.Sanitize()+" WHERE key = $1", key).Scan(&n))
	return n
}

// A context whose deadline comes before Wait ends bounds the wait: DoTx returns the
// context's error, and the caller's transaction and its connection stay usable.
func TestDoTx_DeadlineShorterThanWait(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(modeName(mode), func(t *testing.T) {
			t.Parallel()
			l, b := setup(t, nil)
			ctx := context.Background()
			req := order{Item: "fan", Amount: 1}
			in := intent(t, "acme", "order-fan", req)

			holder, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx)
			_, err = l.DoTx(ctx, holder, in, createOrder("acme", req), nil)
			require.NoError(t, err)

			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = tx.Exec(ctx, "INSERT INTO orders (tenant, item, amount) VALUES ('mine', 'own', 1)")
			require.NoError(t, err)
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			opts := ledger.DoOpts{Mode: mode, Wait: 10 * time.Second}
			var calls atomic.Int32
			_, err = l.DoTx(short, tx, in, counted(&calls, createOrder("acme", req)), &opts)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.False(t, tx.Conn().IsClosed(), "the connection survives")
			_, err = tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err, "the caller's transaction is usable")
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, 1, countOrders(t, b.pool, "mine"), "the caller's own write committed")
		})
	}
}

// Under REPEATABLE READ and SERIALIZABLE, an intent completed after the caller's snapshot
// is reported before fn's statements run: fn is not called when the claim is answered
// before it, and none of its statements runs when the claim travels with the first.
func TestDoTx_SnapshotConflictBeforeFn(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for _, mode := range modes {
			opts := &ledger.DoOpts{Mode: mode}
			t.Run(strings.ReplaceAll(string(iso), " ", "")+modeName(mode), func(t *testing.T) {
				t.Parallel()
				l, b := setup(t, nil)
				ctx := context.Background()
				req := order{Item: "pen", Amount: 1}
				in := intent(t, "acme", "order-pen", req)

				tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer tx.Rollback(ctx)
				_, err = tx.Exec(ctx, snapshotSQL()) // takes the snapshot
				require.NoError(t, err)
				_, err = l.Do(ctx, in, createOrder("acme", req), nil)
				require.NoError(t, err)

				var calls, ran atomic.Int32
				_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					calls.Add(1)
					var one int
					if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
						return ledger.Response{}, err
					}
					ran.Add(1)
					return createOrder("acme", req)(ctx, tx)
				}, opts)
				require.ErrorIs(t, err, ledger.ErrSnapshotConflict)
				require.Zero(t, ran.Load(), "none of fn's statements ran")
				if !callsFnForTakenKey(mode) {
					require.Zero(t, calls.Load(), "fn was not called")
				}
				_, err = tx.Exec(ctx, "SELECT 1")
				require.NoError(t, err, "the caller's transaction is usable")
			})
		}
	}
}

// A claim whose lease outlasts the retention keeps its key for the whole lease: neither a
// purge nor another attempt, in any mode, takes a key whose holder is still within its
// lease, and the holder completes it. The same holds for a lease extended past the
// retention.
func TestClaim_LeaseOutlastsRetention(t *testing.T) {
	t.Parallel()
	// callsFn says whether the second attempt's mode calls fn for a taken key (its
	// statements then fail without running).
	callsFn := map[string]bool{}
	seconds := map[string]func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, calls *atomic.Int32) error{
		"Claim": func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, _ *atomic.Int32) error {
			_, err := l.Claim(ctx, in, nil)
			return err
		},
	}
	for _, mode := range modes {
		callsFn["Do"+modeName(mode)] = callsFnForTakenKey(mode)
		seconds["Do"+modeName(mode)] = func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, calls *atomic.Int32) error {
			_, err := l.Do(ctx, in, counted(calls, createOrder("acme", order{Item: "tea", Amount: 1})), &ledger.DoOpts{Mode: mode})
			return err
		}
	}
	for name, second := range seconds {
		for _, extended := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "Claimed", true: "Extended"}[extended], func(t *testing.T) {
				t.Parallel()
				l, b := setup(t, &ledger.Config{Retention: time.Hour})
				ctx := context.Background()
				in := intent(t, "acme", "order-tea", order{Item: "tea", Amount: 1})
				lease := 3 * time.Hour
				if extended {
					lease = 30 * time.Minute
				}
				first, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: lease})
				require.NoError(t, err)
				if extended {
					b.clock.Advance(20 * time.Minute)
					err = l.Extend(ctx, first.Lease, 3*time.Hour)
					require.NoError(t, err)
				}
				b.clock.Advance(90 * time.Minute) // past the retention, within the lease

				pr, err := l.Purge(ctx, nil)
				require.NoError(t, err)
				require.Zero(t, pr.Deleted, "a purge deleted a record whose lease is live")
				var calls atomic.Int32
				require.ErrorIs(t, second(ctx, l, in, &calls), ledger.ErrInProgress, "a second attempt took a key whose lease is live")
				if !callsFn[name] {
					require.Zero(t, calls.Load(), "fn was called for a key whose lease is live")
				}
				require.Zero(t, countOrders(t, b.pool, "acme"), "fn's writes committed for a key whose lease is live")
				_, err = l.Complete(ctx, first.Lease, ledger.Response{Code: 200, Body: []byte(`{}`)})
				require.NoError(t, err, "the holder of a live lease completes")
			})
		}
	}
}

// ClaimTx on a key whose claim another transaction has not committed waits within its
// wait and never past its context's deadline, and leaves the caller's transaction usable
// either way.
func TestClaimTx_UncommittedClaimBoundsTheWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		timeout time.Duration
		want    func(t *testing.T, err error)
	}{
		{"DeadlineShorterThanWait", 10 * time.Second, 300 * time.Millisecond, func(t *testing.T, err error) {
			require.ErrorIs(t, err, context.DeadlineExceeded)
		}},
		{"NoWait", ledger.NoWait, 0, func(t *testing.T, err error) {
			require.ErrorIs(t, err, ledger.ErrInProgress)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, b := setup(t, nil)
			ctx := context.Background()
			in := intent(t, "acme", "order-tea", order{Item: "tea", Amount: 1})
			holder, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx)
			_, err = l.ClaimTx(ctx, holder, in, nil)
			require.NoError(t, err)

			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			cctx := ctx
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			res, err := l.ClaimTx(cctx, tx, in, &ledger.ClaimOpts{Wait: tc.wait})
			require.Nil(t, res.Lease)
			tc.want(t, err)
			var one int
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the caller's transaction is usable")
			var timeout string
			require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout))
			require.Equal(t, "0", timeout, "the caller's lock_timeout is restored")
			require.NoError(t, tx.Commit(ctx))
		})
	}
}

// ClaimTx without a wait refuses a key that another attempt holds, not a fresh key
// whose INSERT meets a brief lock that has nothing to do with the key: under load, the
// lock that extends the table by a page, taken by another inserter; here a lock that
// a trigger of the table takes while another transaction holds it for 30 ms. It claims
// the key.
func TestClaimTx_NoWaitRidesOutABriefLock(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("Citus refuses triggers on distributed tables, and the test's lock is a trigger's")
	}
	l, b := setup(t, nil)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{b.schema, "brief_lock"}.Sanitize()+`() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$;
		CREATE TRIGGER brief_lock BEFORE INSERT ON `+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+`
		FOR EACH ROW EXECUTE FUNCTION `+pgx.Identifier{b.schema, "brief_lock"}.Sanitize()+`()`)
	require.NoError(t, err)
	other, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx)
	_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)")
	require.NoError(t, err)
	committed := make(chan error, 1)
	time.AfterFunc(30*time.Millisecond, func() { committed <- other.Commit(ctx) })

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	res, err := l.ClaimTx(ctx, tx, intent(t, "acme", "order-fresh", order{Item: "tea", Amount: 1}), &ledger.ClaimOpts{Wait: ledger.NoWait})
	require.NoError(t, <-committed, "the other transaction let its lock go")
	require.NoError(t, err, "no other attempt holds the key")
	require.NotNil(t, res.Lease)
	require.NoError(t, tx.Commit(ctx))
}

// A call whose COMMIT was sent when its context ended cannot know whether PostgreSQL
// committed: it says so with a typed error, and the next call with the key replays the
// result when the commit happened after the first call returned.
func TestDo_CommitInFlightIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "tea", Amount: 1}
	in := intent(t, "acme", "order-tea", req)
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	// A failed assertion must not leave the holder's connection out of the pool, whose
	// Close at cleanup would wait for it for ever.
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = l.DoTx(ctx, holder, in, createOrder("acme", req), nil)
	require.NoError(t, err)

	// ModeOptimistic sends its record with COMMIT; the record waits for the holder's. The
	// call must reach its COMMIT before the deadline, which a loaded machine may not grant
	// in 300 ms: an attempt that the deadline ended sooner rolled back and left the key
	// free (a plain deadline error), and is made again with a longer deadline.
	var calls atomic.Int32
	for attempt, wait := 1, 300*time.Millisecond; ; attempt, wait = attempt+1, 2*wait {
		calls.Store(0)
		cctx, cancel := context.WithTimeout(ctx, wait)
		_, err = l.Do(cctx, in, counted(&calls, createOrder("acme", req)), &ledger.DoOpts{Mode: ledger.ModeOptimistic})
		cancel()
		if errors.Is(err, ledger.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) || attempt == 5 {
			break
		}
		t.Logf("attempt %d: the deadline ended the call before its commit was sent (%v)", attempt, err)
		require.Zero(t, countRecords(t, b.pool, b.schema), "an attempt that never sent its commit wrote nothing")
	}
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the context's error stays visible")
	var unknown *ledger.OutcomeUnknownError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, in.Key, unknown.Key)

	// The holder gives up; the first call's commit then runs on the server, if the server
	// received it: a loaded machine may close the connection before the whole pipeline was
	// written, and Citus passes the cancel pgx sends on to the worker. Either way the key
	// has one outcome: the next call replays the first's, or is the first to run.
	require.NoError(t, holder.Rollback(ctx))
	committed := false
	for until := time.Now().Add(5 * time.Second); !committed && time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
		committed = countRecords(t, b.pool, b.schema) == 1
	}
	res, err := l.Do(ctx, in, counted(&calls, createOrder("acme", req)), &ledger.DoOpts{Mode: ledger.ModeLookUpFirst})
	require.NoError(t, err)
	if committed {
		require.True(t, res.Replayed, "the next call replays the commit that happened after the first call returned")
		require.Equal(t, int32(1), calls.Load())
	} else {
		t.Log("the first call's commit never reached the server")
		require.False(t, res.Replayed)
		require.Equal(t, int32(2), calls.Load())
	}
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

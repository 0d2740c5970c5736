package ledger_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// setupModes is setup, then test once per pgx QueryExecMode with a ledger on a pool of
// fresh connections in that mode: nothing prepared, nothing cached.
func setupModes(t *testing.T, test func(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, b *testBundle)) {
	t.Helper()
	_, b := setup(t, nil)
	createSKUs(t, b.pool, "taken")
	pgtest.EachExecMode(t, b.schema, func(t *testing.T, pool *pgxpool.Pool) {
		l, err := ledger.New(pool, &ledger.Config{Schema: b.schema, Test: ledger.TestConfig{NowFunc: b.clock.Now}})
		require.NoError(t, err)
		test(t, l, pool, b)
	})
}

// insertSKU is the most common shape of a definitive failure: try an INSERT, and on a
// unique violation say "duplicate". The failed statement leaves the transaction aborted.
func insertSKU(sku string) ledger.Func {
	return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, err := tx.Exec(ctx, "INSERT INTO skus (sku) VALUES ($1)", sku)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgsql.UniqueViolation {
			return ledger.Response{}, ledger.Definitive("duplicate", "sku "+sku+" exists")
		}
		if err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{Code: 201, Body: []byte(sku)}, nil
	}
}

func createSKUs(t *testing.T, pool *pgxpool.Pool, existing ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, "CREATE TABLE skus (sku text PRIMARY KEY)")
	require.NoError(t, err)
	for _, s := range existing {
		_, err := pool.Exec(ctx, "INSERT INTO skus (sku) VALUES ($1) ON CONFLICT DO NOTHING", s)
		require.NoError(t, err)
	}
}

// A definitive failure returned after fn's own SQL failed is stored and replayed, in
// every exec mode, from Do and from DoTx.
func TestDo_DefinitiveAfterSQLErrorIsStored(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, b *testBundle) {
		ctx := context.Background()
		for _, mode := range modes {
			opts := &ledger.DoOpts{Mode: mode}
			in := intent(t, "acme", "sku-"+mode.String()+"-"+t.Name(), "taken")
			_, err := l.Do(ctx, in, insertSKU("taken"), opts)
			var derr *ledger.DefinitiveError
			require.ErrorAs(t, err, &derr)
			require.Equal(t, "duplicate", derr.Code)
			require.False(t, derr.Replayed)

			ran := false
			_, err = l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
				ran = true
				return ledger.Response{}, nil
			}, opts)
			require.ErrorAs(t, err, &derr)
			require.True(t, derr.Replayed, "the failure was stored")
			require.Equal(t, "duplicate", derr.Code)
			require.Equal(t, callsFnForTakenKey(mode), ran)
		}

		// DoTx: the failure is stored in the caller's transaction, which stays usable.
		in := intent(t, "acme", "sku-tx-"+t.Name(), "taken")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, "INSERT INTO skus (sku) VALUES ('callers-own-"+t.Name()+"')")
		require.NoError(t, err)
		_, err = l.DoTx(ctx, tx, in, insertSKU("taken"), nil)
		var derr *ledger.DefinitiveError
		require.ErrorAs(t, err, &derr)
		require.Equal(t, "duplicate", derr.Code)
		_, err = tx.Exec(ctx, "SELECT 1")
		require.NoError(t, err, "the caller's transaction is usable")
		require.NoError(t, tx.Commit(ctx))
		_, err = l.Do(ctx, in, insertSKU("taken"), nil)
		require.ErrorAs(t, err, &derr)
		require.True(t, derr.Replayed)
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM skus WHERE sku = 'callers-own-"+t.Name()+"'").Scan(&n))
		require.Equal(t, 1, n, "the caller's own write committed")
	})
}

// Every error path of DoTx leaves the caller's transaction usable, in every exec mode,
// on connections that never ran the ledger's statements before.
func TestDoTx_ErrorPathsLeaveCallerTxUsable(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, b *testBundle) {
		ctx := context.Background()
		done := intent(t, "acme", "done-"+t.Name(), "x")
		_, err := l.Do(ctx, done, insertSKU("done-"+t.Name()), nil)
		require.NoError(t, err)

		held := intent(t, "acme", "held-"+t.Name(), "x")
		holder, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer holder.Rollback(ctx)
		_, err = l.DoTx(ctx, holder, held, insertSKU("held-"+t.Name()), nil)
		require.NoError(t, err)

		boom := errors.New("boom")
		paths := []struct {
			name  string
			in    ledger.Intent
			fn    ledger.Func
			opts  *ledger.DoOpts
			check func(t *testing.T, res ledger.Result, err error)
		}{
			{"FuncSQLError", intent(t, "acme", "sqlerr-"+t.Name(), "x"),
				func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					_, _ = tx.Exec(ctx, "SELECT 1/0")
					return ledger.Response{}, boom
				}, nil,
				func(t *testing.T, _ ledger.Result, err error) { require.ErrorIs(t, err, boom) }},
			{"FailFastInProgress", held, insertSKU("other"), &ledger.DoOpts{Mode: ledger.ModeClaimWithFirstStatement},
				func(t *testing.T, _ ledger.Result, err error) { require.ErrorIs(t, err, ledger.ErrInProgress) }},
			{"CompletedWithFirstStatement", done, insertSKU("again"), &ledger.DoOpts{Mode: ledger.ModeClaimWithFirstStatement},
				func(t *testing.T, res ledger.Result, err error) {
					require.NoError(t, err)
					require.True(t, res.Replayed)
				}},
			{"DefinitiveAfterSQLError", intent(t, "acme", "def-"+t.Name(), "x"), insertSKU("taken"), nil,
				func(t *testing.T, _ ledger.Result, err error) {
					var derr *ledger.DefinitiveError
					require.ErrorAs(t, err, &derr)
				}},
		}
		for _, p := range paths {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			mine := "mine-" + p.name + "-" + t.Name()
			_, err = tx.Exec(ctx, "INSERT INTO skus (sku) VALUES ($1)", mine)
			require.NoError(t, err)
			res, err := l.DoTx(ctx, tx, p.in, p.fn, p.opts)
			p.check(t, res, err)
			_, err = tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err, "%s: the caller's transaction is usable", p.name)
			require.NoError(t, tx.Commit(ctx), p.name)
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM skus WHERE sku = $1", mine).Scan(&n))
			require.Equal(t, 1, n, "%s: the caller's earlier write committed", p.name)
		}
	})
}

// Under REPEATABLE READ and SERIALIZABLE, an intent completed after the caller's snapshot
// cannot be replayed inside it: DoTx says so with a typed, retryable error instead of a
// raw unique violation, the caller's transaction stays usable, and the retry replays.
func TestDoTx_SnapshotIsolation(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(strings.ReplaceAll(string(iso), " ", ""), func(t *testing.T) {
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

			first, err := l.Do(ctx, in, createOrder("acme", req), nil)
			require.NoError(t, err)

			_, err = l.DoTx(ctx, tx, in, createOrder("acme", req), nil)
			require.ErrorIs(t, err, ledger.ErrSnapshotConflict)
			var sqlState interface{ SQLState() string }
			require.ErrorAs(t, err, &sqlState)
			require.Equal(t, pgsql.SerializationFailure, sqlState.SQLState(), "generic serialization-retry loops recognise it")
			_, err = tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err, "the caller's transaction is usable")
			require.NoError(t, tx.Rollback(ctx))

			tx, err = b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			res, err := l.DoTx(ctx, tx, in, createOrder("acme", req), nil)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, first.Body, res.Body)
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, 1, countOrders(t, b.pool, "acme"))
		})
	}
}

// Values the ledger cannot store are refused with typed errors before or instead of a
// raw PostgreSQL error, and nothing is half-written.
func TestDo_Bounds(t *testing.T) {
	t.Parallel()
	t.Run("LongWait", func(t *testing.T) {
		t.Parallel()
		l, b := setup(t, nil)
		ctx := context.Background()
		req := order{Item: "clock", Amount: 1}
		in := intent(t, "acme", "order-clock", req)
		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Wait: 30 * 24 * time.Hour})
		require.NoError(t, err)
		require.False(t, res.Replayed)
		// The same wait while another attempt holds the key, briefly.
		in2 := intent(t, "acme", "order-clock-2", req)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = l.DoTx(ctx, tx, in2, createOrder("acme", req), nil)
		require.NoError(t, err)
		go func() {
			time.Sleep(200 * time.Millisecond)
			_ = tx.Commit(ctx)
		}()
		res, err = l.Do(ctx, in2, createOrder("acme", req), &ledger.DoOpts{Wait: 1 << 62, Mode: ledger.ModeOptimistic})
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 2, countOrders(t, b.pool, "acme"))
	})
	t.Run("MaxKeyLen", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.NewSchema(t)
		_, err := ledger.New(pool, &ledger.Config{Schema: schema, MaxKeyLen: 100_000})
		require.Error(t, err, "a key limit the index cannot hold is refused")
		require.Contains(t, err.Error(), "MaxKeyLen")
		l, err := ledger.New(pool, &ledger.Config{Schema: schema, MaxKeyLen: ledger.MaxKeyLenLimit})
		require.NoError(t, err)
		_, err = ledger.Migrate(context.Background(), pool, schema)
		require.NoError(t, err)
		fp, _ := keys.FingerprintJSON("x")
		long := strings.Repeat("k", ledger.MaxKeyLenLimit)
		scope := keys.Scope{Tenant: strings.Repeat("t", keys.MaxScopeLen), Operation: strings.Repeat("o", keys.MaxScopeLen)}
		res, err := l.Do(context.Background(), ledger.Intent{Scope: scope, Key: keys.Key(long), Fingerprint: fp},
			func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 1}, nil }, nil)
		require.NoError(t, err, "the longest key and scope the ledger accepts fit its index")
		require.False(t, res.Replayed)

		_, err = l.Do(context.Background(), ledger.Intent{Scope: scope, Key: keys.Key(long + "k"), Fingerprint: fp},
			func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{}, nil }, nil)
		require.ErrorIs(t, err, keys.ErrTooLong)
		require.Less(t, len(err.Error()), 300, "an error never echoes a whole key")
	})
	t.Run("InvalidText", func(t *testing.T) {
		t.Parallel()
		l, b := setup(t, nil)
		ctx := context.Background()
		req := order{Item: "nul", Amount: 1}
		for _, bad := range []string{"order/\x00", "order/\xff\xfe"} {
			in := intent(t, "acme", "ref-"+keys.Key(strings.ToValidUTF8(strings.ReplaceAll(bad, "\x00", "0"), "x")).String(), req)
			_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
				resp, err := createOrder("acme", req)(ctx, tx)
				resp.ResourceRef = bad
				return resp, err
			}, nil)
			require.ErrorIs(t, err, ledger.ErrInvalidResponse)
			var pgErr *pgconn.PgError
			require.False(t, errors.As(err, &pgErr), "not a raw PostgreSQL error: %v", err)
		}
		require.Equal(t, 0, countOrders(t, b.pool, "acme"), "the mutation was rolled back")
		require.Equal(t, 0, countRecords(t, b.pool, b.schema))

		// A definitive failure with text PostgreSQL cannot store is still stored: the
		// failure is the outcome, so its text is made storable rather than lost.
		in := intent(t, "acme", "def-nul", req)
		_, err := l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{}, ledger.Definitive("bad\x00code", "message \xff with \x00 NUL")
		}, nil)
		var derr *ledger.DefinitiveError
		require.ErrorAs(t, err, &derr)
		_, err = l.Do(ctx, in, createOrder("acme", req), nil)
		require.ErrorAs(t, err, &derr)
		require.True(t, derr.Replayed)
		require.Equal(t, "bad\uFFFDcode", derr.Code)
		require.Equal(t, "message \uFFFD with \uFFFD NUL", derr.Message)
	})
}

// A completed intent always replays: callers that race each other on a completed key
// never hear "in progress", in any mode.
func TestDo_CompletedKeyNeverInProgress(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "desk", Amount: 1}
	in := intent(t, "acme", "order-desk", req)
	first, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			for range 5 {
				res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: modes[len(modes)*i/n]})
				if err == nil && (!res.Replayed || string(res.Body) != string(first.Body)) {
					err = errors.New("not a replay of the first result")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// The first call reports the time the record holds, as every replay does.
func TestDo_CreatedAtIsTheRecordedTime(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	b.clock.Advance(-time.Hour) // the application clock and the record disagree with time.Now
	req := order{Item: "hat", Amount: 1}
	for _, mode := range modes {
		in := intent(t, "acme", "order-hat-"+mode.String(), req)
		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: mode})
		require.NoError(t, err)
		replay, err := l.Do(ctx, in, createOrder("acme", req), nil)
		require.NoError(t, err)
		require.True(t, replay.CreatedAt.Equal(res.CreatedAt), "first %s, replay %s", res.CreatedAt, replay.CreatedAt)

		fin := intent(t, "acme", "fail-hat-"+mode.String(), req)
		failed, err := l.Do(ctx, fin, func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{}, ledger.Definitive("no", "no")
		}, &ledger.DoOpts{Mode: mode})
		require.Error(t, err)
		rec, err := l.Get(ctx, fin.Scope, fin.Key)
		require.NoError(t, err)
		require.True(t, rec.CreatedAt.Equal(failed.CreatedAt), "failure: first %s, record %s", failed.CreatedAt, rec.CreatedAt)
	}
}

// Without a test clock, a first execution records the time its process read when fn
// returned, which it and every replay report, and its record expires a retention after
// that time (the database's clock at the transaction's start is earlier here); the
// record's UpdatedAt is the database's clock when it was written.
func TestDo_RecordTimesWithoutTestClock(t *testing.T) {
	t.Parallel()
	_, b := setup(t, nil)
	l, err := ledger.New(b.pool, &ledger.Config{Schema: b.schema, Retention: time.Hour})
	require.NoError(t, err)
	ctx := context.Background()
	req := order{Item: "cap", Amount: 1}
	for _, mode := range modes {
		in := intent(t, "acme", "order-cap-"+mode.String(), req)
		var dbBefore, dbAfter time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT now()`).Scan(&dbBefore))
		before := time.Now().Truncate(time.Microsecond)
		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: mode})
		require.NoError(t, err)
		after := time.Now()
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT now()`).Scan(&dbAfter))
		require.False(t, res.CreatedAt.Before(before) || res.CreatedAt.After(after), "CreatedAt %s outside [%s, %s]", res.CreatedAt, before, after)
		require.Zero(t, res.CreatedAt.Nanosecond()%1000, "CreatedAt %s is finer than PostgreSQL keeps", res.CreatedAt)

		replay, err := l.Do(ctx, in, createOrder("acme", req), nil)
		require.NoError(t, err)
		require.True(t, replay.Replayed)
		require.True(t, replay.CreatedAt.Equal(res.CreatedAt), "first %s, replay %s", res.CreatedAt, replay.CreatedAt)
		rec, err := l.Get(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		require.True(t, rec.CreatedAt.Equal(res.CreatedAt), "record %s, first %s", rec.CreatedAt, res.CreatedAt)
		require.False(t, rec.UpdatedAt.Before(dbBefore) || rec.UpdatedAt.After(dbAfter), "UpdatedAt %s outside the database's [%s, %s]", rec.UpdatedAt, dbBefore, dbAfter)

		var left float64
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - now()) FROM idempotency_records WHERE key = $1`, string(in.Key)).Scan(&left))
		require.InDelta(t, time.Hour.Seconds(), left, 30, "the record expires a retention from now")
		require.Equal(t, time.Hour, rec.ExpiresAt.Sub(rec.CreatedAt), "the record expires a retention after its time")
	}
}

// ModeOptimistic sends no claim: of two concurrent attempts, the first to commit wins,
// the other's writes are rolled back and it replays the winner's result. An error of
// fn for an intent already carried out is answered by the record.
func TestDo_Optimistic(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "kite", Amount: 1}
	in := intent(t, "acme", "order-kite", req)
	first := &ledger.DoOpts{Mode: ledger.ModeOptimistic}

	inside, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	slow := make(chan ledger.Result, 1)
	go func() {
		res, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			resp, err := createOrder("acme", req)(ctx, tx)
			close(inside)
			<-release
			return resp, err
		}, first)
		assertNoError(t, err)
		slow <- res
	}()
	<-inside
	fast, err := l.Do(ctx, in, createOrder("acme", req), first)
	require.NoError(t, err)
	require.False(t, fast.Replayed, "the attempt that commits first wins")
	close(release)
	res := <-slow
	require.True(t, res.Replayed, "the other replays it")
	require.Equal(t, fast.Body, res.Body)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"), "the loser's order was rolled back")

	// fn fails for an intent carried out before: the stored result answers.
	res, err = l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{}, errors.New("order exists")
	}, first)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, fast.Body, res.Body)
}

// ModeClaimFirst claims before it looks: a first execution, a replay (whose rollback
// travels with its read), a reused key and an in-flight duplicate all behave as in the
// other modes, in every exec mode on fresh connections.
func TestDo_ClaimFirst(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, l *ledger.Ledger, pool *pgxpool.Pool, b *testBundle) {
		ctx := context.Background()
		opts := &ledger.DoOpts{Mode: ledger.ModeClaimFirst}
		in := intent(t, "acme", "cf-"+t.Name(), "pen")
		first, err := l.Do(ctx, in, insertSKU("cf-"+t.Name()), opts)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		for range 3 {
			res, err := l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
				t.Error("fn ran for a completed key")
				return ledger.Response{}, nil
			}, opts)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.Equal(t, first.Body, res.Body)
		}
		other := intent(t, "acme", "cf-"+t.Name(), "another pen")
		_, err = l.Do(ctx, other, insertSKU("x"), opts)
		require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)

		held := intent(t, "acme", "cf-held-"+t.Name(), "pen")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = l.DoTx(ctx, tx, held, insertSKU("cf-held-"+t.Name()), nil)
		require.NoError(t, err)
		_, err = l.Do(ctx, held, insertSKU("never"), opts)
		require.ErrorIs(t, err, ledger.ErrInProgress, "fail fast while the first is in flight")
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = tx.Commit(ctx)
		}()
		res, err := l.Do(ctx, held, insertSKU("never"), &ledger.DoOpts{Mode: ledger.ModeClaimFirst, Wait: 10 * time.Second})
		require.NoError(t, err)
		require.True(t, res.Replayed, "a waiting duplicate replays")
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM skus WHERE sku = 'never'").Scan(&n))
		require.Equal(t, 0, n)
	})
}

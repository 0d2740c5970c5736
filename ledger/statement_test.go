package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// insertOrderStmt is a single-statement mutation: one order, its row returned.
func insertOrderStmt(tenant string, o order) ledger.Statement {
	return ledger.Statement{
		SQL:  `INSERT INTO orders (tenant, item, amount) VALUES ($1, $2, $3) RETURNING id, item, amount`,
		Args: []any{tenant, o.Item, o.Amount},
		Code: 201,
	}
}

// sequenceValue is how many times nextval was called on the test's sequence: a
// sequence does not roll back, so it shows whether a statement ran at all.
func sequenceValue(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM stmt_seq`).Scan(&n))
	return n
}

// seqStmt inserts an order whose amount comes from a sequence.
func seqStmt(tenant string) ledger.Statement {
	return ledger.Statement{
		SQL:  `INSERT INTO orders (tenant, item, amount) VALUES ($1, 'seq', nextval('stmt_seq')) RETURNING amount`,
		Args: []any{tenant},
	}
}

func setupStmt(t *testing.T, cfg *ledger.Config) (*ledger.Ledger, *testBundle) {
	t.Helper()
	l, b := setup(t, cfg)
	_, err := b.pool.Exec(context.Background(), `CREATE SEQUENCE stmt_seq`)
	require.NoError(t, err)
	return l, b
}

// A first execution runs the statement and stores its rows as JSON; a replay returns
// the same bytes and runs nothing; another payload under the key is refused.
func TestDoStatement_FirstReplayMismatch(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	req := order{Item: "book", Amount: 1200}
	in := intent(t, "acme", "order-book", req)

	first, err := l.DoStatement(ctx, in, insertOrderStmt("acme", req), nil)
	require.NoError(t, err)
	require.False(t, first.Replayed)
	require.Equal(t, 201, first.Response.Code)
	var rows []struct {
		ID     int64  `json:"id"`
		Item   string `json:"item"`
		Amount int64  `json:"amount"`
	}
	require.NoError(t, json.Unmarshal(first.Response.Body, &rows))
	require.Len(t, rows, 1)
	require.Equal(t, "book", rows[0].Item)
	require.Equal(t, int64(1200), rows[0].Amount)

	again, err := l.DoStatement(ctx, in, insertOrderStmt("acme", req), nil)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Response.Body, again.Response.Body, "a replay is byte-equal")
	require.Equal(t, 201, again.Response.Code)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))

	// Do replays what DoStatement stored, and the other way round.
	res, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, first.Response.Body, res.Response.Body)

	other := intent(t, "acme", "order-book", order{Item: "book", Amount: 1})
	_, err = l.DoStatement(ctx, other, insertOrderStmt("acme", order{Item: "book", Amount: 1}), nil)
	var mm *ledger.FingerprintMismatchError
	require.ErrorAs(t, err, &mm)
	require.Equal(t, in.Fingerprint, mm.StoredFingerprint)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))

	rec, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, ledger.StateCompleted, rec.State)
	require.Equal(t, first.Response.Body, rec.Response.Body)
}

// A key that is taken (completed, held by another attempt, or used with another
// payload) never runs the statement: the sequence it calls does not move.
func TestDoStatement_TakenKeyNeverRunsTheStatement(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "seq-1", order{Item: "seq"})
	_, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), sequenceValue(t, b.pool))

	t.Run("Completed", func(t *testing.T) {
		res, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, int64(1), sequenceValue(t, b.pool))
	})
	t.Run("Mismatch", func(t *testing.T) {
		_, err := l.DoStatement(ctx, intent(t, "acme", "seq-1", order{Item: "other"}), seqStmt("acme"), nil)
		require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
		require.Equal(t, int64(1), sequenceValue(t, b.pool))
	})
	t.Run("InFlight", func(t *testing.T) {
		held := intent(t, "acme", "seq-held", order{Item: "seq"})
		started, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := l.Do(ctx, held, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
					return ledger.Response{}, err
				}
				close(started)
				<-release
				return ledger.Response{Code: 200, Body: []byte(`[]`)}, nil
			}, nil)
			done <- err
		}()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the holder did not start")
		}
		_, err := l.DoStatement(ctx, held, seqStmt("acme"), nil)
		require.ErrorIs(t, err, ledger.ErrInProgress)
		require.Equal(t, int64(1), sequenceValue(t, b.pool), "the statement did not run for a key held by another attempt")
		close(release)
		require.NoError(t, <-done)
	})
}

// roundTrips makes a ledger in a fresh schema over one connection whose round trips are
// counted, and returns trips, which runs call for a pen order under key, checks that it
// was a first execution (or, with replay, a replay), and returns the round trips it
// took.
func roundTrips(t *testing.T, call func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, req order) (ledger.Result, error)) func(key string, replay bool) int64 {
	t.Helper()
	_, b := setupStmt(t, nil)
	tc := &pgtest.Trips{}
	pool := pgtest.Pool(t, b.schema, func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.ConnConfig.DialFunc = tc.Dial(cfg.ConnConfig.DialFunc)
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	l, err := ledger.New(pool, &ledger.Config{Schema: b.schema})
	require.NoError(t, err)
	return func(key string, replay bool) int64 {
		tc.Reset()
		req := order{Item: "pen", Amount: 1}
		res, err := call(context.Background(), l, intent(t, "acme", key, req), req)
		require.NoError(t, err)
		require.Equal(t, replay, res.Replayed)
		return tc.Load()
	}
}

// One round trip for a first execution and one for a replay, with the statement
// prepared on the connection; a replay leaves the connection's statements prepared.
func TestDoStatement_RoundTrips(t *testing.T) {
	t.Parallel()
	trips := roundTrips(t, func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, req order) (ledger.Result, error) {
		return l.DoStatement(ctx, in, insertOrderStmt("acme", req), nil)
	})
	trips("warm", false)
	trips("warm", true)
	require.Equal(t, int64(1), trips("a", false), "a first execution")
	require.Equal(t, int64(1), trips("a", true), "a replay")
	require.Equal(t, int64(1), trips("a", true), "a second replay")
	require.Equal(t, int64(1), trips("b", false), "the next first execution")
}

// Many goroutines on one key: one effect, one answer for all, under -race.
func TestDoStatement_ConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	req := order{Item: "lamp", Amount: 4200}
	in := intent(t, "acme", "order-lamp", req)
	const n = 50
	var wg sync.WaitGroup
	results := make([]ledger.Result, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = l.DoStatement(ctx, in, insertOrderStmt("acme", req), &ledger.StatementOpts{Wait: 30 * time.Second})
		})
	}
	close(start)
	wg.Wait()
	firsts := 0
	for i := range n {
		require.NoError(t, errs[i])
		if !results[i].Replayed {
			firsts++
		}
		require.Equal(t, results[0].Response.Body, results[i].Response.Body)
	}
	require.Equal(t, 1, firsts)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// Without a wait, a duplicate of an attempt in flight fails fast, retryable.
func TestDoStatement_FailsFastWithoutWait(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "order-x", order{Item: "x"})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return ledger.Response{Body: []byte(`[]`)}, err
	}, nil)
	require.NoError(t, err)
	_, err = l.DoStatement(ctx, in, seqStmt("acme"), &ledger.StatementOpts{Wait: ledger.NoWait})
	var ip *ledger.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, int64(0), sequenceValue(t, b.pool))
	require.NoError(t, tx.Rollback(ctx))
	// The holder rolled back: the key is free.
	res, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

// A waiter whose holder fails takes the key and runs the statement once.
func TestDoStatement_WaiterTakesAFailedHoldersKey(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "order-y", order{Item: "y"})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = l.DoTx(ctx, tx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return ledger.Response{Body: []byte(`[]`)}, err
	}, nil)
	require.NoError(t, err)
	done := make(chan struct{})
	var res ledger.Result
	go func() {
		defer close(done)
		res, err = l.DoStatement(ctx, in, seqStmt("acme"), &ledger.StatementOpts{Wait: 30 * time.Second})
	}()
	// Roll back once the waiter is queued on the key's lock.
	waitForLockWaiter(t, b.pool)
	require.NoError(t, tx.Rollback(ctx))
	<-done
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, int64(1), sequenceValue(t, b.pool))
	require.JSONEq(t, `[{"amount":1}]`, string(res.Response.Body))
}

// waitForLockWaiter returns once a backend waits for an advisory lock.
func waitForLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n))
		if n > 0 {
			return
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
	t.Fatal("no backend waited for the key's lock")
}

// Statements the guarded form cannot run are refused before anything is sent.
func TestDoStatement_RefusesBadStatements(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		sql  string
		args []any
		want string
	}{
		"NoReturning":     {`INSERT INTO orders (tenant, item, amount) VALUES ('acme', 'x', 1)`, nil, "RETURNING"},
		"TwoStatements":   {`INSERT INTO orders (tenant, item, amount) VALUES ('acme', 'x', 1) RETURNING id; DELETE FROM orders RETURNING id`, nil, "more than one statement"},
		"Commit":          {`COMMIT`, nil, "transaction-control"},
		"Begin":           {`BEGIN`, nil, "transaction-control"},
		"Select":          {`SELECT 1`, nil, "must be an INSERT"},
		"Empty":           {`  -- nothing`, nil, "must be an INSERT"},
		"MissingArgument": {`INSERT INTO orders (tenant, item, amount) VALUES ($1, $2, 1) RETURNING id`, []any{"acme"}, "uses $2"},
		"Unterminated":    {`INSERT INTO orders (tenant, item, amount) VALUES ('acme, 'x', 1) RETURNING id`, nil, "unterminated"},
		"WithNoReturning": {`WITH a AS (SELECT 1) INSERT INTO orders (tenant, item, amount) VALUES ('acme', 'x', 1)`, nil, "RETURNING"},
		"ReturningInText": {`UPDATE orders SET item = 'returning' WHERE id = 0`, nil, "RETURNING"},
		"QueryOption":     {`INSERT INTO orders (tenant, item, amount) VALUES ($1, 'x', 1) RETURNING id`, []any{pgx.QueryExecModeExec, "acme"}, "query options"},
	} {
		t.Run(name, func(t *testing.T) {
			in := intent(t, "acme", "bad-"+name, order{Item: name})
			_, err := l.DoStatement(ctx, in, ledger.Statement{SQL: tc.sql, Args: tc.args}, nil)
			require.ErrorContains(t, err, tc.want)
			_, err = l.Get(ctx, in.Scope, in.Key)
			require.ErrorIs(t, err, ledger.ErrNotFound)
		})
	}
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
}

// A statement that fails stores nothing and leaves the key free; one that PostgreSQL
// refuses to plan (no RETURNING inside a WITH query, an unknown table) too.
func TestDoStatement_FailingStatementLeavesTheKeyFree(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `ALTER TABLE orders ADD CONSTRAINT positive CHECK (amount > 0)`)
	require.NoError(t, err)
	in := intent(t, "acme", "order-neg", order{Item: "neg"})
	_, err = l.DoStatement(ctx, in, insertOrderStmt("acme", order{Item: "neg", Amount: -1}), nil)
	require.ErrorContains(t, err, "positive")
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)

	_, err = l.DoStatement(ctx, in, ledger.Statement{SQL: `INSERT INTO nowhere (x) VALUES (1) RETURNING x`}, nil)
	require.ErrorContains(t, err, "nowhere")

	// The statement's own errors are not the claim's refusal, even of the same SQLSTATE.
	_, err = l.DoStatement(ctx, in, ledger.Statement{SQL: `INSERT INTO orders (tenant, item, amount) VALUES ($1, 'x', $2::text::int) RETURNING id`,
		Args: []any{"acme", "abc"}}, &ledger.StatementOpts{Wait: time.Minute})
	require.ErrorContains(t, err, "invalid input syntax")
	_, err = l.DoStatement(ctx, in, ledger.Statement{SQL: `INSERT INTO orders (tenant, item, amount) VALUES ($1, 'x', $2::int / (SELECT count(*) FROM orders WHERE false)) RETURNING id`,
		Args: []any{"acme", 1}}, &ledger.StatementOpts{Wait: time.Minute})
	require.ErrorContains(t, err, "division by zero")

	// An argument the statement's parameter cannot take fails before anything is sent:
	// a plain error, not an unknown outcome.
	_, err = l.DoStatement(ctx, in, ledger.Statement{SQL: `INSERT INTO orders (tenant, item, amount) VALUES ($1, 'x', $2) RETURNING id`,
		Args: []any{"acme", struct{ X chan int }{}}}, nil)
	require.Error(t, err)
	require.False(t, errors.Is(err, ledger.ErrOutcomeUnknown), "%v", err)

	res, err := l.DoStatement(ctx, in, insertOrderStmt("acme", order{Item: "neg", Amount: 1}), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// A WITH query of writes, with its own common table expressions, runs guarded too, and
// its rows are the response; so does an UPDATE of many rows, and one of none.
func TestDoStatement_WithQueriesAndManyRows(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	st := ledger.Statement{SQL: `WITH a AS (INSERT INTO orders (tenant, item, amount) VALUES ($1, 'a', 1) RETURNING id),
		bb AS (INSERT INTO orders (tenant, item, amount) VALUES ($1, 'b', 2) RETURNING id)
		SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM bb) AS inserted;`, Args: []any{"acme"}}
	res, err := l.DoStatement(ctx, intent(t, "acme", "with", order{Item: "with"}), st, nil)
	require.NoError(t, err)
	require.Equal(t, `[{"inserted":2}]`, string(res.Response.Body))
	require.Equal(t, 2, countOrders(t, b.pool, "acme"))

	res, err = l.DoStatement(ctx, intent(t, "acme", "many", order{Item: "many"}), ledger.Statement{
		SQL: `UPDATE orders SET amount = amount * 10 WHERE tenant = @tenant RETURNING item, amount`, Args: []any{pgx.NamedArgs{"tenant": "acme"}}}, nil)
	require.NoError(t, err)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(res.Response.Body, &rows))
	require.Len(t, rows, 2)

	res, err = l.DoStatement(ctx, intent(t, "acme", "none", order{Item: "none"}), ledger.Statement{
		SQL: `DELETE FROM orders WHERE tenant = 'nobody' RETURNING id`}, nil)
	require.NoError(t, err)
	require.Equal(t, `[]`, string(res.Response.Body))
	require.Equal(t, 2, countOrders(t, b.pool, "acme"))
}

// A body over the limit rolls the statement back and stores nothing.
func TestDoStatement_BodyTooLarge(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, &ledger.Config{MaxBodyBytes: 64})
	ctx := context.Background()
	in := intent(t, "acme", "big", order{Item: "big"})
	_, err := l.DoStatement(ctx, in, insertOrderStmt("acme", order{Item: strings.Repeat("x", 100), Amount: 1}), nil)
	var tooLarge *ledger.BodyTooLargeError
	require.ErrorAs(t, err, &tooLarge)
	require.Equal(t, 64, tooLarge.Limit)
	require.Greater(t, tooLarge.Size, 100)
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)
}

// An expired record counts as absent: a late retry runs the statement again, once, and
// replaces the record.
func TestDoStatement_ExpiredRecordIsANewIntent(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, &ledger.Config{Retention: time.Hour})
	ctx := context.Background()
	in := intent(t, "acme", "late", order{Item: "seq"})
	_, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Hour)
	res, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, `[{"amount":2}]`, string(res.Response.Body))
	res, err = l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, int64(2), sequenceValue(t, b.pool))
}

// A stored failure from Do is replayed as its definitive error.
func TestDoStatement_ReplaysAStoredFailure(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "declined", order{Item: "tv"})
	_, err := l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{}, ledger.Definitive("card_declined", "declined")
	}, nil)
	require.Error(t, err)
	_, err = l.DoStatement(ctx, in, seqStmt("acme"), nil)
	var derr *ledger.DefinitiveError
	require.ErrorAs(t, err, &derr)
	require.True(t, derr.Replayed)
	require.Equal(t, int64(0), sequenceValue(t, b.pool))
}

// A statement whose commit became durable and whose answer was lost (the backend
// terminated while the commit was held) is an unknown outcome, never a rollback; a
// retry replays.
func TestDoStatement_LostAnswerIsUnknown(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	lh, h := heldLedger(t, b)
	ctx := context.Background()
	req := order{Item: "lamp", Amount: 4200}
	in := intent(t, "acme", "order-lamp", req)
	done := h.TerminateAsync(ctx, t, 10*time.Second)
	_, err := lh.DoStatement(ctx, in, insertOrderStmt("acme", req), nil)
	<-done
	var unknown *ledger.OutcomeUnknownError
	require.ErrorAs(t, err, &unknown, "a lost answer must not read as a rollback")
	require.Equal(t, in.Key, unknown.Key)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"), "the commit was durable")

	res, err := l.DoStatement(ctx, in, insertOrderStmt("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// A context already done sends nothing and is not an unknown outcome.
func TestDoStatement_CancelledContext(t *testing.T) {
	t.Parallel()
	l, _ := setupStmt(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.DoStatement(ctx, intent(t, "acme", "c", order{}), seqStmt("acme"), nil)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, errors.Is(err, ledger.ErrOutcomeUnknown))
}

// The default mode's round trips, with warm statements: a first execution whose fn
// sends one statement takes 2; a replay 2 (the refused claim, then the rollback with the
// read of the record), a second replay in a row 2, and the next first execution on the
// connection 2: the refused batch's statements are prepared by name, so pgx neither
// deallocates nor prepares them again.
func TestDo_DefaultModeRoundTrips(t *testing.T) {
	t.Parallel()
	trips := roundTrips(t, func(ctx context.Context, l *ledger.Ledger, in ledger.Intent, req order) (ledger.Result, error) {
		return l.Do(ctx, in, createOrder("acme", req), nil)
	})
	trips("warm", false)
	trips("warm", true)
	trips("warm-2", false)
	require.Equal(t, int64(2), trips("a", false), "a first execution")
	require.Equal(t, int64(2), trips("a", true), "a replay")
	require.Equal(t, int64(2), trips("a", true), "a second replay")
	require.Equal(t, int64(2), trips("b", false), "the next first execution")
}

// A pending external claim under a live lease is waited for within the wait and then
// reported in progress; the statement does not run. Once the claim completes, the call
// replays it.
func TestDoStatement_PendingExternalClaim(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "ext", order{Item: "seq"})
	c, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.NotNil(t, c.Lease)
	_, err = l.DoStatement(ctx, in, seqStmt("acme"), &ledger.StatementOpts{Wait: 20 * time.Millisecond})
	require.ErrorIs(t, err, ledger.ErrInProgress)
	require.Equal(t, int64(0), sequenceValue(t, b.pool))
	_, err = l.Complete(ctx, c.Lease, ledger.Response{Code: 200, Body: []byte(`[{"amount":7}]`)})
	require.NoError(t, err)
	res, err := l.DoStatement(ctx, in, seqStmt("acme"), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, `[{"amount":7}]`, string(res.Response.Body))
	require.Equal(t, int64(0), sequenceValue(t, b.pool))
}

// DoStatement runs and replays the same in every pgx QueryExecMode: it prepares its
// statements by name whatever the connection's mode.
func TestDoStatement_EveryExecMode(t *testing.T) {
	t.Parallel()
	_, b := setupStmt(t, nil)
	pgtest.EachExecMode(t, b.schema, func(t *testing.T, pool *pgxpool.Pool) {
		l, err := ledger.New(pool, &ledger.Config{Schema: b.schema})
		require.NoError(t, err)
		ctx := context.Background()
		tenant := strings.ToLower(strings.ReplaceAll(t.Name()[strings.LastIndex(t.Name(), "/")+1:], "_", "-"))
		req := order{Item: "cup", Amount: 3}
		in := intent(t, tenant, "cup", req)
		first, err := l.DoStatement(ctx, in, insertOrderStmt(tenant, req), nil)
		require.NoError(t, err)
		again, err := l.DoStatement(ctx, in, insertOrderStmt(tenant, req), nil)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Response.Body, again.Response.Body)
		require.Equal(t, 1, countOrders(t, b.pool, tenant))
	})
}

// A record written by an attempt that takes no claim (as ModeOptimistic writes it at
// its commit, here in a transaction held open) and committed while the statement's
// record waits for it answers the call: the statement's writes roll back, and the call
// replays that record.
func TestDoStatement_RecordCommittedAfterTheLook(t *testing.T) {
	t.Parallel()
	l, b := setupStmt(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "late-optimist", order{Item: "seq"})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+`
		(tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at)
		VALUES ($1, $2, $3, $4, 'completed', 200, '[{"amount":7}]', 1, now(), now(), now() + interval '1 day')`,
		in.Scope.Tenant, in.Scope.Operation, string(in.Key), string(in.Fingerprint))
	require.NoError(t, err)

	type answer struct {
		res ledger.Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := l.DoStatement(ctx, in, seqStmt("acme"), &ledger.StatementOpts{Wait: 10 * time.Second})
		done <- answer{res, err}
	}()
	// The statement ran, and its record's insert waits for the open transaction's.
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%oncekit_w%')`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	got := <-done
	require.NoError(t, got.err)
	require.True(t, got.res.Replayed)
	require.Equal(t, `[{"amount":7}]`, string(got.res.Response.Body))
	var orders int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Zero(t, orders, "the statement's writes rolled back with its record")
	require.Equal(t, int64(1), sequenceValue(t, b.pool), "the statement ran once")
}

package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// firstAttempt is an inbox with ModeRecordWithFirstStatement on pool, whose search_path is the
// schema of setup.
func firstAttempt(t *testing.T, pool *pgxpool.Pool) *inbox.Inbox {
	t.Helper()
	schema := schemaOf(t, pool)
	ib, err := inbox.New(pool, &inbox.Config{Schema: schema, Mode: inbox.ModeRecordWithFirstStatement})
	require.NoError(t, err)
	return ib
}

// Under ModeRecordWithFirstStatement a duplicate's handler is called, but nothing it sends runs: its
// statements return ErrDuplicate, the delivery is reported a duplicate whatever the
// handler returns, and the effect exists once. In every exec mode, on fresh
// connections.
func TestInbox_RecordWithFirstStatementDuplicates(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, _ *inbox.Inbox, pool *pgxpool.Pool) {
		ib := firstAttempt(t, pool)
		ctx := context.Background()
		msg := "first-" + t.Name()
		res, err := ib.Handle(ctx, "billing", msg, credit(msg))
		require.NoError(t, err)
		require.False(t, res.Duplicate)

		var stmtErr error
		res, err = ib.Handle(ctx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			_, stmtErr = tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ($1, 100)`, msg)
			return stmtErr
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.False(t, res.Rejected)
		require.ErrorIs(t, stmtErr, inbox.ErrDuplicate)

		// A handler that swallows the error and sends more is still a duplicate, and
		// none of its statements ran.
		res, err = ib.Handle(ctx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			_ = credit(msg)(ctx, tx)
			_ = credit(msg)(ctx, tx)
			return nil
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		// A statement that cannot travel in a batch (two in one string) sends the record
		// first, alone, and is refused all the same.
		res, err = ib.Handle(ctx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ('`+msg+`', 1); INSERT INTO credits (message, amount) VALUES ('`+msg+`', 2)`)
			require.ErrorIs(t, err, inbox.ErrDuplicate)
			return err
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = $1`, msg)

		// The connections went back to the pool clean: a new message is handled.
		res, err = ib.Handle(ctx, "billing", msg+"-next", credit(msg+"-next"))
		require.NoError(t, err)
		require.False(t, res.Duplicate)
	})
}

// Under ModeRecordWithFirstStatement a handler that sends nothing still records its message (the
// record travels with COMMIT); a failed handler leaves no record; a definitive
// rejection after a failed statement is recorded; in every exec mode.
func TestInbox_RecordWithFirstStatementOutcomes(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, _ *inbox.Inbox, pool *pgxpool.Pool) {
		ib := firstAttempt(t, pool)
		ctx := context.Background()
		msg := "outcomes-" + t.Name()

		two := "two-" + t.Name()
		res, err := ib.Handle(ctx, "billing", two, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ('`+two+`', 1); INSERT INTO credits (message, amount) VALUES ('`+two+`', 2)`)
			return err
		})
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		testsuite.RequireCount(t.Context(), t, pool, 2, `SELECT count(*) FROM credits WHERE message = $1`, two)

		res, err = ib.Handle(ctx, "silent", msg, func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		res, err = ib.Handle(ctx, "silent", msg, func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, err)
		require.True(t, res.Duplicate)

		boom := errors.New("boom")
		_, err = ib.Handle(ctx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			_ = credit(msg)(ctx, tx)
			return boom
		})
		require.ErrorIs(t, err, boom)
		_, err = ib.Handle(ctx, "billing", msg, func(context.Context, pgx.Tx) error { return boom })
		require.ErrorIs(t, err, boom, "a handler that fails before any statement")
		testsuite.RequireCount(t.Context(), t, pool, 0, `SELECT count(*) FROM credits WHERE message = $1`, msg)
		res, err = ib.Handle(ctx, "billing", msg, credit(msg))
		require.NoError(t, err)
		require.False(t, res.Duplicate, "a failed handler left no record")

		poison := "poison-" + t.Name()
		res, err = ib.Handle(ctx, "billing", poison, rejectDuplicate(poison))
		var derr *ledger.DefinitiveError
		require.ErrorAs(t, err, &derr)
		require.True(t, res.Rejected)
		res, err = ib.Handle(ctx, "billing", poison, rejectDuplicate(poison))
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.True(t, res.Rejected)

		// A definitive rejection before any statement is recorded too.
		early := "early-" + t.Name()
		_, err = ib.Handle(ctx, "billing", early, func(context.Context, pgx.Tx) error {
			return ledger.Definitive("bad_payload", "not JSON")
		})
		require.ErrorAs(t, err, &derr)
		res, err = ib.Handle(ctx, "billing", early, credit(early))
		require.NoError(t, err)
		require.Equal(t, inbox.Result{Duplicate: true, Rejected: true}, res)
	})
}

// Under ModeRecordWithFirstStatement, HandleTx joins the caller's transaction: a duplicate and a failure
// each leave it usable with its earlier writes, in every exec mode.
func TestInbox_RecordWithFirstStatementHandleTx(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, _ *inbox.Inbox, pool *pgxpool.Pool) {
		ib := firstAttempt(t, pool)
		ctx := context.Background()
		msg := "tx-" + t.Name()
		boom := errors.New("boom")
		for i, fn := range []inbox.HandlerFunc{
			credit(msg), // handled
			credit(msg), // a duplicate
			func(ctx context.Context, tx pgx.Tx) error { // fails after a failed statement
				_, _ = tx.Exec(ctx, "SELECT 1/0")
				return boom
			},
		} {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ($1, 5)`, "callers-"+msg)
			require.NoError(t, err)
			other := msg
			if i == 2 {
				other = msg + "-fails"
			}
			res, err := ib.HandleTx(ctx, tx, "billing", other, fn)
			if i == 2 {
				require.ErrorIs(t, err, boom)
			} else {
				require.NoError(t, err)
				require.Equal(t, i == 1, res.Duplicate)
			}
			_, err = tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err, "the caller's transaction is usable")
			require.NoError(t, tx.Commit(ctx))
		}
		testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = $1`, msg)
		testsuite.RequireCount(t.Context(), t, pool, 3, `SELECT count(*) FROM credits WHERE message = $1`, "callers-"+msg)
		res, err := ib.Handle(ctx, "billing", msg+"-fails", credit(msg+"-fails"))
		require.NoError(t, err)
		require.False(t, res.Duplicate, "the failed HandleTx left no record")
	})
}

// An expired record counts as absent under ModeRecordWithFirstStatement too, and a panicking handler
// leaves nothing behind.
func TestInbox_RecordWithFirstStatementExpiredAndPanic(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ib := firstAttempt(t, pool)
	ctx := context.Background()
	_, err := ib.Handle(ctx, "billing", "old", credit("old"))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE inbox_messages SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	res, err := ib.Handle(ctx, "billing", "old", credit("late"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'late'`)

	require.Panics(t, func() {
		_, _ = ib.Handle(ctx, "billing", "panics", func(ctx context.Context, tx pgx.Tx) error {
			_ = credit("panics")(ctx, tx)
			panic("handler bug")
		})
	})
	testsuite.RequireCount(t.Context(), t, pool, 0, `SELECT count(*) FROM credits WHERE message = 'panics'`)
	res, err = ib.Handle(ctx, "billing", "panics", credit("panics"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
}

// The round trips each protocol promises, with warm statement caches: a first delivery
// whose handler sends one statement takes 3 (as pgx.BeginFunc does), or 2 under
// ModeRecordWithFirstStatement; a duplicate takes 2, or 4 under ModeRecordWithFirstStatement (its batch failed, so the
// rollback goes alone and pgx deallocates the batch's cached statements before the
// read), and the next first delivery on that connection one more (pgx prepares them
// again).
func TestInbox_RoundTrips(t *testing.T) {
	t.Parallel()
	_, setupPool := setup(t)
	schema := schemaOf(t, setupPool)
	tc := &pgtest.Trips{}
	pool := pgtest.Pool(t, schema, func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.MinConns = 1, 1
		cfg.ConnConfig.DialFunc = tc.Dial(cfg.ConnConfig.DialFunc)
		// No liveness ping on acquire (pgxpool's default after a second idle): it would
		// be counted.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	ctx := context.Background()
	for _, first := range []bool{false, true} {
		ib, err := inbox.New(pool, &inbox.Config{Schema: schema, Mode: modeOf(first)})
		require.NoError(t, err)
		name := map[bool]string{false: "default", true: "first"}[first]
		trips := func(msg string, dup bool) int64 {
			tc.Reset()
			res, err := ib.Handle(ctx, "billing", msg, credit(msg))
			require.NoError(t, err)
			require.Equal(t, dup, res.Duplicate)
			return tc.Load()
		}
		// Warm every statement both paths use.
		trips(name+"-warm", false)
		trips(name+"-warm", true)
		trips(name+"-warm-2", false)

		want := map[bool][3]int64{false: {3, 2, 3}, true: {2, 4, 3}}[first]
		require.Equal(t, want[0], trips(name, false), "a first delivery, record with first statement %v", first)
		require.Equal(t, want[1], trips(name, true), "a duplicate, record with first statement %v", first)
		require.Equal(t, want[2], trips(name+"-next", false), "the next first delivery, record with first statement %v", first)
	}
}

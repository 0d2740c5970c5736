package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func setup(t *testing.T) (*inbox.Inbox, *pgxpool.Pool) {
	t.Helper()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up),
		`CREATE TABLE credits (id bigserial PRIMARY KEY, message text NOT NULL, amount bigint NOT NULL)`)
	ib, err := inbox.New(pool, &inbox.Config{Schema: schema})
	require.NoError(t, err)
	return ib, pool
}

// schemaOf is the schema pool's connections work in.
func schemaOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var schema string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema))
	return schema
}

func credit(message string) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ($1, 100)`, message)
		return err
	}
}

// A consumer commits its database work and crashes before the ack: the broker
// redelivers, the inbox recognises the message, and the effect exists once.
func TestInbox_CommitThenCrashBeforeAck(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	res, err := ib.Handle(ctx, "billing", "msg-1", credit("msg-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	// The ack never reaches the broker; it redelivers.
	res, err = ib.Handle(ctx, "billing", "msg-1", credit("msg-1"))
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'msg-1'`)

	// Another subscriber handles the same message independently.
	res, err = ib.Handle(ctx, "analytics", "msg-1", credit("msg-1"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
}

// A message whose handler failed is handled on redelivery.
func TestInbox_FailedHandlerIsRetried(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	boom := errors.New("boom")
	_, err := ib.Handle(ctx, "billing", "msg-2", func(ctx context.Context, tx pgx.Tx) error {
		_ = credit("msg-2")(ctx, tx)
		return boom
	})
	require.ErrorIs(t, err, boom)
	testsuite.RequireCount(t.Context(), t, pool, 0, `SELECT count(*) FROM credits`)
	res, err := ib.Handle(ctx, "billing", "msg-2", credit("msg-2"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'msg-2'`)
}

// A poison message is rejected definitively: its writes are undone and it is never
// handled again.
func TestInbox_RejectedMessage(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	calls := 0
	poison := func(ctx context.Context, tx pgx.Tx) error {
		calls++
		_ = credit("msg-3")(ctx, tx)
		return ledger.Definitive("bad_payload", "amount is not a number")
	}
	res, err := ib.Handle(ctx, "billing", "msg-3", poison)
	var derr *ledger.DefinitiveError
	require.ErrorAs(t, err, &derr)
	require.True(t, res.Rejected)
	res, err = ib.Handle(ctx, "billing", "msg-3", poison)
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.True(t, res.Rejected)
	require.Equal(t, 1, calls)
	testsuite.RequireCount(t.Context(), t, pool, 0, `SELECT count(*) FROM credits`)
}

// Many consumers receive the same message at once: one effect, and every other delivery
// a duplicate; in both modes.
func TestInbox_ConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := context.Background()
	schema := schemaOf(t, pool)
	for _, first := range []bool{false, true} {
		ib, err := inbox.New(pool, &inbox.Config{Schema: schema, Mode: modeOf(first)})
		require.NoError(t, err)
		msg := fmt.Sprintf("msg-race-%v", first)
		var handled, dups atomic.Int32
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				res, err := ib.Handle(ctx, "billing", msg, credit(msg))
				if err != nil {
					t.Errorf("handle: %v", err)
					return
				}
				if res.Duplicate {
					dups.Add(1)
				} else {
					handled.Add(1)
				}
			})
		}
		wg.Wait()
		require.Equal(t, int32(1), handled.Load(), "record with first statement %v", first)
		require.Equal(t, int32(31), dups.Load(), "record with first statement %v", first)
		testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = $1`, msg)
	}
}

// HandleTx joins the caller's transaction; a duplicate leaves it usable.
func TestInbox_HandleTx(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	for i := range 2 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		res, err := ib.HandleTx(ctx, tx, "billing", "msg-tx", credit("msg-tx"))
		require.NoError(t, err)
		require.Equal(t, i == 1, res.Duplicate)
		_, err = tx.Exec(ctx, `SELECT 1`)
		require.NoError(t, err, "the transaction is still usable")
		require.NoError(t, tx.Commit(ctx))
	}
	testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'msg-tx'`)
}

func TestInbox_BadInputAndPurge(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	_, err := ib.Handle(ctx, "", "m", credit("m"))
	require.Error(t, err)
	_, err = ib.Handle(ctx, "billing", "bad\nid", credit("m"))
	require.Error(t, err)
	_, err = ib.Handle(ctx, "billing", "m", nil)
	require.ErrorIs(t, err, inbox.ErrNilHandler)
	for i := range 30 {
		_, err := ib.Handle(ctx, "billing", fmt.Sprintf("old-%d", i), credit("x"))
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `UPDATE inbox_messages SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	purged, err := ib.Purge(ctx, &ledger.PurgeOpts{BatchSize: 7})
	require.NoError(t, err)
	require.Equal(t, int64(30), purged.Deleted)
	require.Equal(t, 5, purged.Batches, "30 records in batches of 7")
	// An expired record counts as absent: a late redelivery is handled again.
	res, err := ib.Handle(ctx, "billing", "old-1", credit("late"))
	require.NoError(t, err)
	require.False(t, res.Duplicate)
}

// modeOf is ModeRecordWithFirstStatement when withFirst is set, else the default.
func modeOf(withFirst bool) inbox.Mode {
	if withFirst {
		return inbox.ModeRecordWithFirstStatement
	}
	return inbox.ModeRecordFirst
}

// A purge with a pause waits between its statements and ends, with what it deleted so
// far, when its context is cancelled during a pause.
func TestInbox_PurgePause(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	for i := range 5 {
		_, err := ib.Handle(ctx, "billing", fmt.Sprintf("old-%d", i), credit("x"))
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `UPDATE inbox_messages SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		res ledger.PurgeResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := ib.Purge(pctx, &ledger.PurgeOpts{BatchSize: 2, Pause: time.Hour})
		done <- outcome{res, err}
	}()
	require.Eventually(t, func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM inbox_messages`).Scan(&n) == nil && n == 3
	}, 30*time.Second, 10*time.Millisecond, "the first statement deletes 2 of 5")
	cancel()
	select {
	case o := <-done:
		require.ErrorIs(t, o.err, context.Canceled)
		require.Equal(t, ledger.PurgeResult{Deleted: 2, Batches: 1}, o.res)
	case <-time.After(30 * time.Second):
		t.Fatal("the purge did not end when its context was cancelled during a pause")
	}
	_, err = ib.Purge(ctx, &ledger.PurgeOpts{BatchSize: -1})
	require.Error(t, err, "a negative batch size is refused")
}

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	require.Equal(t, "oncekit", inbox.SchemaDefault)
	require.Equal(t, "inbox", inbox.MigrationLine)
	require.Equal(t, "github.com/oncekit/oncekit/inbox", inbox.InstrumentationName)
	require.Equal(t, "oncekit.subscriber", inbox.AttrSubscriber)
}

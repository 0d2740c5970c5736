package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// rejectDuplicate tries an INSERT and, when it violates a unique constraint, rejects
// the message definitively: the failed statement leaves the transaction aborted.
func rejectDuplicate(message string) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO credits (id, message, amount) VALUES (1, $1, 100)`, message)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgsql.UniqueViolation {
			return ledger.Definitive("duplicate_credit", "credit 1 exists")
		}
		return err
	}
}

// setupModes is setup, then test once per pgx QueryExecMode with an inbox on a pool of
// fresh connections in that mode.
func setupModes(t *testing.T, test func(t *testing.T, ib *inbox.Inbox, pool *pgxpool.Pool)) {
	t.Helper()
	_, pool := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO credits (id, message, amount) VALUES (1, 'first', 100); SELECT setval('credits_id_seq', 1000)`)
	require.NoError(t, err)
	schema := schemaOf(t, pool)
	pgtest.EachExecMode(t, schema, func(t *testing.T, pool *pgxpool.Pool) {
		ib, err := inbox.New(pool, &inbox.Config{Schema: schema})
		require.NoError(t, err)
		test(t, ib, pool)
	})
}

// A definitive rejection after the handler's own statement failed is recorded, so the
// poison message is not handled again, in every exec mode, from Handle and HandleTx.
func TestInbox_RejectionAfterSQLErrorIsRecorded(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, ib *inbox.Inbox, pool *pgxpool.Pool) {
		ctx := context.Background()
		msg := "poison-" + t.Name()
		res, err := ib.Handle(ctx, "billing", msg, rejectDuplicate(msg))
		var derr *ledger.DefinitiveError
		require.ErrorAs(t, err, &derr)
		require.True(t, res.Rejected)
		res, err = ib.Handle(ctx, "billing", msg, func(context.Context, pgx.Tx) error {
			t.Error("the handler ran again for a rejected message")
			return nil
		})
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.True(t, res.Rejected)

		// HandleTx: the rejection is recorded in the caller's transaction, which goes on.
		msg = "poison-tx-" + t.Name()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ($1, 5)`, "callers-"+msg)
		require.NoError(t, err)
		res, err = ib.HandleTx(ctx, tx, "billing", msg, rejectDuplicate(msg))
		require.ErrorAs(t, err, &derr)
		require.True(t, res.Rejected)
		require.NoError(t, tx.Commit(ctx))
		testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'callers-`+msg+`'`)
		res, err = ib.Handle(ctx, "billing", msg, rejectDuplicate(msg))
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.True(t, res.Rejected)
	})
}

// Whatever the handler did to the transaction, a failed HandleTx leaves the caller's
// transaction usable and its earlier writes intact.
func TestInbox_HandleTxFailureLeavesCallerTxUsable(t *testing.T) {
	t.Parallel()
	setupModes(t, func(t *testing.T, ib *inbox.Inbox, pool *pgxpool.Pool) {
		ctx := context.Background()
		msg := "fails-" + t.Name()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `INSERT INTO credits (message, amount) VALUES ($1, 5)`, "callers-"+msg)
		require.NoError(t, err)
		boom := errors.New("boom")
		_, err = ib.HandleTx(ctx, tx, "billing", msg, func(ctx context.Context, tx pgx.Tx) error {
			_, _ = tx.Exec(ctx, "SELECT 1/0")
			return boom
		})
		require.ErrorIs(t, err, boom)
		_, err = tx.Exec(ctx, "SELECT 1")
		require.NoError(t, err, "the caller's transaction is usable")
		require.NoError(t, tx.Commit(ctx))
		testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM credits WHERE message = 'callers-`+msg+`'`)
		// The message was not recorded: its redelivery is handled.
		res, err := ib.Handle(ctx, "billing", msg, credit(msg))
		require.NoError(t, err)
		require.False(t, res.Duplicate)
	})
}

// Purges racing deliveries never turn a delivery into an error: a message is either a
// duplicate or, once its record is gone, handled as new.
func TestInbox_PurgeRacingDeliveries(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := context.Background()
	schema := schemaOf(t, pool)
	ib, err := inbox.New(pool, &inbox.Config{Schema: schema, Retention: time.Millisecond})
	require.NoError(t, err)
	stop := make(chan struct{})
	var purger sync.WaitGroup
	purger.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := ib.Purge(ctx, nil); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				msg := "m-" + string(rune('a'+(i+w)%4))
				if _, err := ib.Handle(ctx, "billing", msg, credit(msg)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	purger.Wait()
}

// A negative retention would make every record born expired, and every duplicate run
// again: it is refused.
func TestInbox_NegativeRetentionRefused(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	_, err := inbox.New(pool, &inbox.Config{Retention: -time.Hour})
	require.Error(t, err)
	require.Contains(t, err.Error(), "Retention")
}

// Bad names are blamed on what they are: the subscriber or the message ID.
func TestInbox_InputErrorsNameTheirPart(t *testing.T) {
	t.Parallel()
	ib, _ := setup(t)
	ctx := context.Background()
	noop := func(context.Context, pgx.Tx) error { return nil }
	_, err := ib.Handle(ctx, "", "m", noop)
	require.ErrorContains(t, err, "subscriber")
	require.NotContains(t, err.Error(), "tenant")
	_, err = ib.Handle(ctx, "billing", string(make([]byte, 300)), noop)
	require.ErrorContains(t, err, "message ID")
	require.NotContains(t, err.Error(), "keys.Derive")
	require.NotContains(t, err.Error(), "tenant")
}

package ledger_test

import (
	"context"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// Several purgers at once delete every expired record exactly once, in batches, and
// keep live ones.
func TestPurge_ConcurrentBatches(t *testing.T) {
	t.Parallel()
	l, b := setup(t, &ledger.Config{Retention: time.Hour})
	ctx := context.Background()
	noop := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 200}, nil }
	for i := range 250 {
		_, err := l.Do(ctx, intent(t, "acme", fmt.Sprintf("old-%d", i), i), noop, nil)
		require.NoError(t, err)
	}
	b.clock.Advance(30 * time.Minute)
	for i := range 10 {
		_, err := l.Do(ctx, intent(t, "acme", fmt.Sprintf("new-%d", i), i), noop, nil)
		require.NoError(t, err)
	}
	b.clock.Advance(31 * time.Minute) // the old ones expired, the new ones not

	var deleted atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			res, err := l.Purge(ctx, &ledger.PurgeOpts{BatchSize: 20})
			if assertNoError(t, err) {
				deleted.Add(res.Deleted)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(250), deleted.Load())
	require.Equal(t, 10, countRecords(t, b.pool, b.schema))

	res, err := l.Purge(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(0), res.Deleted)
}

// Many processes migrating one schema at once apply each migration exactly once.
func TestMigrate_Concurrent(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	target := schema + "_ledger"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{target}.Sanitize()+" CASCADE")
	})
	var applied atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			res, err := ledger.Migrate(ctx, pool, target)
			if assertNoError(t, err) {
				applied.Add(int32(len(res.Applied)))
			}
		})
	}
	wg.Wait()
	files, err := fs.ReadDir(ledger.Migrations(), ".")
	require.NoError(t, err)
	require.Equal(t, int32(len(files)), applied.Load(), "each migration applied once")
	res, err := ledger.Migrate(ctx, pool, target)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{target, "oncekit_migrations"}.Sanitize()).Scan(&n))
	require.Equal(t, len(files), n)
}

// A purge with a pause waits between its statements, not after the last, and a context
// cancelled during a pause ends it with what it deleted so far, counted right.
func TestPurge_Pause(t *testing.T) {
	t.Parallel()
	l, b := setup(t, &ledger.Config{Retention: time.Hour})
	ctx := context.Background()
	noop := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 200}, nil }
	for i := range 25 {
		_, err := l.Do(ctx, intent(t, "acme", fmt.Sprintf("old-%d", i), i), noop, nil)
		require.NoError(t, err)
	}
	b.clock.Advance(2 * time.Hour)

	t.Run("NoPauseAfterTheLast", func(t *testing.T) {
		res, err := l.Purge(ctx, &ledger.PurgeOpts{BatchSize: 10, MaxBatches: 1, Pause: time.Hour})
		require.NoError(t, err, "one statement, so no pause")
		require.Equal(t, ledger.PurgeResult{Deleted: 10, Batches: 1}, res)
	})
	t.Run("CancelledDuringAPause", func(t *testing.T) {
		if pgtest.IsCitus() {
			// The test knows the purge is in its pause when the first batch's deletions
			// are visible; on Citus they are visible on the worker well before the
			// coordinator's answer reaches the purge. The pause is the same code there.
			t.Skip("on Citus the first statement's deletions show before its answer arrives")
		}
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type outcome struct {
			res ledger.PurgeResult
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := l.Purge(pctx, &ledger.PurgeOpts{BatchSize: 10, Pause: time.Hour})
			done <- outcome{res, err}
		}()
		require.Eventually(t, func() bool { return countRecords(t, b.pool, b.schema) == 5 }, 30*time.Second, 10*time.Millisecond,
			"the first statement deletes 10 of the 15 left")
		// The deletions show once the server commits them, a moment before the purge reads
		// the statement's answer; a cancel in that moment would interrupt the statement,
		// not the pause. The pause is an hour: a second more puts the purge well inside it.
		time.Sleep(time.Second)
		cancel()
		select {
		case o := <-done:
			require.ErrorIs(t, o.err, context.Canceled)
			require.Equal(t, ledger.PurgeResult{Deleted: 10, Batches: 1}, o.res)
		case <-time.After(30 * time.Second):
			t.Fatal("the purge did not end when its context was cancelled during a pause")
		}
	})
	t.Run("NegativeRefused", func(t *testing.T) {
		for _, o := range []ledger.PurgeOpts{{BatchSize: -1}, {MaxBatches: -1}} {
			_, err := l.Purge(ctx, &o)
			require.Error(t, err)
			require.Contains(t, err.Error(), "negative")
		}
	})
	t.Run("PausesByDefault", func(t *testing.T) {
		left := countRecords(t, b.pool, b.schema) // 5, or 15 where the cancel was skipped
		start := time.Now()
		res, err := l.Purge(ctx, &ledger.PurgeOpts{BatchSize: 2})
		require.NoError(t, err)
		require.Equal(t, int64(left), res.Deleted)
		require.Equal(t, left/2+1, res.Batches, "batches of 2 until one deletes fewer")
		require.GreaterOrEqual(t, time.Since(start), time.Duration(res.Batches-1)*ledger.PurgePauseDefault, "a pause between each two statements")
	})
	t.Run("NoPause", func(t *testing.T) {
		for round, pause := range []time.Duration{ledger.NoPause, -time.Second} {
			for i := range 4 {
				_, err := l.Do(ctx, intent(t, "acme", fmt.Sprintf("nopause-%d-%d", round, i), i), noop, nil)
				require.NoError(t, err)
			}
			b.clock.Advance(2 * time.Hour)
			res, err := l.Purge(ctx, &ledger.PurgeOpts{BatchSize: 2, Pause: pause})
			require.NoError(t, err, "a negative pause means none, not an error")
			require.Equal(t, ledger.PurgeResult{Deleted: 4, Batches: 3}, res)
		}
	})
}

// A purge keeps a record that a new intent took over while the purge was deciding what
// to delete: the expired record it picked is live again when its delete reaches it. On
// Citus the purge picks its batch by key and deletes it in a second step, where another
// transaction's update of a picked record makes the delete wait; the record must be
// checked again then.
func TestPurge_SparesRecordTakenOverMeanwhile(t *testing.T) {
	t.Parallel()
	l, b := setup(t, &ledger.Config{Retention: time.Minute})
	ctx := context.Background()
	in := intent(t, "acme", "taken-over", 1)
	noop := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 200}, nil }
	_, err := l.Do(ctx, in, noop, nil)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute) // expired by the ledger's clock

	// A transaction makes the record live again and keeps it locked while a purge runs.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, `UPDATE idempotency_records SET expires_at = $1 WHERE tenant = 'acme' AND key = $2`,
		b.clock.Now().Add(time.Hour), string(in.Key))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	done := make(chan error, 1)
	var res ledger.PurgeResult
	go func() {
		var err error
		res, err = l.Purge(ctx, nil)
		done <- err
	}()
	if pgtest.IsCitus() {
		// The delete by key waits for the update.
		require.Eventually(t, func() bool {
			var waiting int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM citus_locks WHERE locktype = 'transactionid' AND NOT granted`).Scan(&waiting)
			return err == nil && waiting > 0
		}, 30*time.Second, 5*time.Millisecond, "the purge waits for the update")
	} else {
		// The purge skips the locked record.
		require.NoError(t, <-done)
		done <- nil
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.Equal(t, int64(0), res.Deleted)
	rec, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.NotNil(t, rec, "the live record is kept")
}

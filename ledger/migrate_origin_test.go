package ledger_test

import (
	"context"
	"io/fs"
	"strconv"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/migrate"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// migrationsUpTo is the ledger's line up to version n, as an older release shipped it.
func migrationsUpTo(t *testing.T, n int) fs.FS {
	t.Helper()
	out := fstest.MapFS{}
	entries, err := fs.ReadDir(ledger.Migrations(), ".")
	require.NoError(t, err)
	for _, e := range entries {
		if v, err := strconv.Atoi(e.Name()[:3]); err != nil || v > n {
			continue
		}
		b, err := fs.ReadFile(ledger.Migrations(), e.Name())
		require.NoError(t, err)
		out[e.Name()] = &fstest.MapFile{Data: b}
	}
	return out
}

// Migration 004 on a schema at version 3 whose table holds rows: the columns are added
// and the indexes built concurrently, so that writes go on while an index waits for an
// older transaction; two processes migrating at once apply it once; the indexes end
// valid, and records written during the build are found by their origin.
func TestMigrate_OriginAppliesWhileWritesGoOn(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("the build's progress is watched on the coordinator's own table")
	}
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	line := migrate.Line{Name: ledger.MigrationLine, Files: migrationsUpTo(t, 3)}
	_, err := migrate.Up(ctx, pool, schema, line)
	require.NoError(t, err)
	table := pgx.Identifier{schema, "idempotency_records"}.Sanitize()
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (tenant, operation, key, fingerprint, state, created_at, updated_at, expires_at)
		SELECT 'acme', 'orders.create', 'v1:wf:order-old:' || i, 'fp', 'completed', now(), now(), now() + interval '1 day'
		FROM generate_series(1, 2000) i`)
	require.NoError(t, err)

	// An older transaction with a snapshot, which CREATE INDEX CONCURRENTLY waits for.
	old, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = old.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
	require.NoError(t, err)
	_, err = old.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	defer func() { _ = old.Rollback(ctx) }()

	type outcome struct {
		res ledger.MigrateResult
		err error
	}
	results := make(chan outcome, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := ledger.Migrate(ctx, pool, schema)
			results <- outcome{res, err}
		}()
	}

	// The build waits for the old transaction...
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_progress_create_index
			WHERE relid = $1::regclass AND phase = 'waiting for old snapshots')`, table).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 10*time.Millisecond, "CREATE INDEX CONCURRENTLY never waited for the older transaction")

	// ...and meanwhile the ledger writes, with origins, in every mode.
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	writeCtx, cancel := context.WithTimeout(ledger.WithOrigin(ctx, testOrigin), 30*time.Second)
	defer cancel()
	for _, m := range modes {
		in := ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "orders.create"},
			Key: keys.Run("run-a", modeName(m)), Fingerprint: keys.FingerprintBytes([]byte("x"))}
		_, err := l.Do(writeCtx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Body: []byte(`1`)}, nil
		}, &ledger.DoOpts{Mode: m})
		require.NoError(t, err, "a write while the index builds, mode %s", m)
	}
	var building bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_progress_create_index WHERE relid = $1::regclass)`,
		table).Scan(&building))
	require.True(t, building, "the writes went through while the index was still building")

	require.NoError(t, old.Rollback(ctx))
	wg.Wait()
	close(results)
	applied := 0
	for r := range results {
		require.NoError(t, r.err)
		if len(r.res.Applied) > 0 {
			require.Equal(t, []int{4}, r.res.Applied)
			applied++
		}
	}
	require.Equal(t, 1, applied, "one of the two processes applies 004")

	var invalid, indexes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT i.indisvalid), count(*)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND c.relname IN ('idempotency_records_workflow_id_idx',
			'idempotency_records_run_id_idx', 'idempotency_records_activity_type_idx')`, table).Scan(&invalid, &indexes))
	require.Equal(t, 3, indexes)
	require.Zero(t, invalid)
	var path string
	require.NoError(t, pool.QueryRow(ctx, "SHOW search_path").Scan(&path))
	require.Contains(t, path, schema, "the pool's connections keep their search_path")

	recs, err := l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "order-1"}})
	require.NoError(t, err)
	require.Len(t, recs, len(modes))
	recs, err = l.List(ctx, &ledger.ListOpts{KeyPatterns: []string{"v1:wf:order-old:%"}, Limit: 5000})
	require.NoError(t, err)
	require.Len(t, recs, 2000, "the old rows are kept")
	res, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
}

// A file marked to run outside a transaction still runs inside one when the caller
// hands Migrate a transaction, with its indexes built plainly.
func TestMigrate_OriginInACallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema, migrate.Line{Name: ledger.MigrationLine, Files: migrationsUpTo(t, 3)})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := ledger.Migrate(ctx, tx, schema)
	require.NoError(t, err)
	require.Equal(t, []int{4}, res.Applied)
	require.NoError(t, tx.Commit(ctx))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1
		AND indexname IN ('idempotency_records_workflow_id_idx', 'idempotency_records_run_id_idx', 'idempotency_records_activity_type_idx')`,
		schema).Scan(&n))
	require.Equal(t, 3, n)
}

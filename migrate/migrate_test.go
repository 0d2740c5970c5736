package migrate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// lines counts the recorded files of each line.
func lines(t *testing.T, conn interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema string) map[string]int {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT line, count(*) FROM "+pgx.Identifier{schema, "oncekit_migrations"}.Sanitize()+" GROUP BY line")
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var line string
		var n int
		require.NoError(t, rows.Scan(&line, &n))
		out[line] = n
	}
	require.NoError(t, rows.Err())
	return out
}

var want = map[string]int{"ledger": 4, "webhook": 1, "inbox": 1, "outbox": 5, "agent": 1}

// wantFiles is the number of files of every line.
func wantFiles() int {
	n := 0
	for _, v := range want {
		n += v
	}
	return n
}

// Every feature's line is applied once, whatever number of processes race to do it.
func TestUp_AppliesEveryLineOnce(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewSchema(t)
	ctx := context.Background()
	target := "mig_" + uuid.NewString()[:8]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+target+" CASCADE") })
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	for range 16 {
		wg.Go(func() {
			res, err := migrate.Up(ctx, pool, target)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			applied += len(res.Applied)
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, wantFiles(), applied, "each file applied by one caller")
	require.Equal(t, want, lines(t, pool, target))
	res, err := migrate.Up(ctx, pool, target)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
}

// The plain SQL export, applied on a plain connection (twice), sets up a schema that
// works and that Up finds current.
func TestScript_AppliedByAnotherTool(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewSchema(t)
	ctx := context.Background()
	target := "script_" + uuid.NewString()[:8]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+target+" CASCADE") })
	script, err := migrate.Script(target)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	for range 2 {
		_, err = conn.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err)
	}
	require.Equal(t, want, lines(t, pool, target))
	res, err := migrate.Up(ctx, pool, target)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "Up finds the script's schema current")

	l, err := ledger.New(pool, &ledger.Config{Schema: target})
	require.NoError(t, err)
	in := ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "pay"}, Key: "k-1", Fingerprint: keys.FingerprintBytes([]byte("x"))}
	_, err = l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{Body: []byte(`1`)}, nil }, nil)
	require.NoError(t, err)
	out, err := outbox.New(pool, &outbox.Config{Schema: target})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "t", Payload: []byte(`{}`)})
		return err
	}))
}

// A schema set up before migration lines (one version per file, the inbox and outbox
// in the ledger's migration 003, a claim function since dropped) is brought to the
// lines: its records stay as line "legacy", every line's files, safe to run again, are
// applied and recorded, and nothing is lost.
func TestUp_UpgradesASchemaFromBeforeLines(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewSchema(t)
	ctx := context.Background()
	target := "legacy_" + uuid.NewString()[:8]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+target+" CASCADE") })
	script, err := migrate.Script(target)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	ident := pgx.Identifier{target}.Sanitize()
	_, err = pool.Exec(ctx, `
		DROP TABLE `+ident+`.oncekit_migrations;
		CREATE TABLE `+ident+`.oncekit_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO `+ident+`.oncekit_migrations (version, name) VALUES (1, 'idempotency_records'), (2, 'entity_versions'),
			(3, 'inbox_outbox'), (4, 'drop_claim_function'), (5, 'outbox_leases');
		CREATE FUNCTION `+ident+`.oncekit_claim(text, text, text, timestamptz, integer) RETURNS void LANGUAGE sql AS 'SELECT';
		INSERT INTO `+ident+`.inbox_messages (subscriber, message_id, received_at, expires_at) VALUES ('s', 'm', now(), now() + interval '1 day')`,
		pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)

	res, err := migrate.Up(ctx, pool, target)
	require.NoError(t, err)
	require.Len(t, res.Applied, wantFiles())
	got := lines(t, pool, target)
	require.Equal(t, 5, got["legacy"])
	delete(got, "legacy")
	require.Equal(t, want, got)
	var fn, msgs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = 'oncekit_claim'`, target).Scan(&fn))
	require.Zero(t, fn, "the ledger's line drops the old function")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+ident+".inbox_messages").Scan(&msgs))
	require.Equal(t, 1, msgs)
}

// Status lists each line's applied and pending files, and Check refuses a schema that a
// newer oncekit migrated.
func TestStatus_PendingAppliedAndAhead(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewSchema(t)
	ctx := context.Background()
	target := "status_" + uuid.NewString()[:8]
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+target+" CASCADE") })
	st, err := migrate.Status(ctx, pool, target)
	require.NoError(t, err)
	require.Len(t, st, 5)
	for _, l := range st {
		require.Empty(t, l.Applied, l.Line)
		require.Len(t, l.Pending, want[l.Line], l.Line)
	}
	require.NoError(t, migrate.Check(target, st))

	_, err = migrate.Up(ctx, pool, target)
	require.NoError(t, err)
	st, err = migrate.Status(ctx, pool, target)
	require.NoError(t, err)
	for _, l := range st {
		require.Empty(t, l.Pending, l.Line)
		require.Len(t, l.Applied, want[l.Line], l.Line)
	}

	_, err = pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{target, "oncekit_migrations"}.Sanitize()+
		" (line, version, name) VALUES ('ledger', 99, 'from_the_future'), ('sagas', 1, 'new_line')")
	require.NoError(t, err)
	st, err = migrate.Status(ctx, pool, target)
	require.NoError(t, err)
	require.Len(t, st, 6)
	require.Equal(t, 99, st[0].Ahead[0].Version)
	require.Equal(t, "sagas", st[5].Line)
	err = migrate.Check(target, st)
	var ahead *migrate.SchemaAheadError
	require.ErrorAs(t, err, &ahead)
	require.ErrorIs(t, err, migrate.ErrSchemaAhead)
	require.Len(t, ahead.Ahead, 2)
	require.Contains(t, err.Error(), "ledger/099_from_the_future")
}

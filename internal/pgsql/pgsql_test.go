package pgsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestIsUniqueViolation inserts a duplicate for real: on a single PostgreSQL the error
// names its constraint; through a Citus coordinator, where the table is distributed, it
// arrives without ConstraintName and its message names the shard's constraint.
func TestIsUniqueViolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewSchema(t)
	_, err := pool.Exec(ctx, `CREATE TABLE accounts (tenant text NOT NULL, id text NOT NULL, CONSTRAINT accounts_pkey PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	if pgtest.IsCitus() {
		_, err = pool.Exec(ctx, `SELECT create_distributed_table('accounts', 'tenant')`)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO accounts VALUES ('acme', 'a1')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO accounts VALUES ('acme', 'a1')`)
	require.Error(t, err)
	require.True(t, pgsql.IsUniqueViolation(err, "accounts_pkey"), "%v", err)
	require.False(t, pgsql.IsUniqueViolation(err, "accounts"))
	require.False(t, pgsql.IsUniqueViolation(err, "other_pkey"))
}

func TestIsUniqueViolationShardNames(t *testing.T) {
	t.Parallel()
	citus := func(msg string) error {
		return &pgconn.PgError{Code: pgsql.UniqueViolation, Message: msg}
	}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"Named":        {&pgconn.PgError{Code: pgsql.UniqueViolation, ConstraintName: "records_pkey"}, true},
		"NamedOther":   {&pgconn.PgError{Code: pgsql.UniqueViolation, ConstraintName: "records_pkey_1"}, false},
		"Shard":        {citus(`duplicate key value violates unique constraint "records_pkey_102028"`), true},
		"ShardOfOther": {citus(`duplicate key value violates unique constraint "records_pkey_extra_102028"`), false},
		"NoShard":      {citus(`duplicate key value violates unique constraint "records_pkey_"`), false},
		"Unquoted":     {citus(`duplicate key value violates unique constraint records_pkey_1`), false},
		"OtherCode":    {&pgconn.PgError{Code: pgsql.CheckViolation, Message: `"records_pkey_1"`}, false},
		"NotPostgres":  {context.Canceled, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, pgsql.IsUniqueViolation(tc.err, "records_pkey"))
		})
	}
}

// A purge whose context ends while a batch runs lets that batch finish, and counts
// what it deleted: the rows are gone, and the answer says so.
func TestPurgeRun_ContextEndsDuringABatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewSchema(t)
	_, err := pool.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY, old bool NOT NULL);
		INSERT INTO items SELECT i, true FROM generate_series(1, 5) i;
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
		CREATE TRIGGER slow BEFORE DELETE ON items FOR EACH STATEMENT EXECUTE FUNCTION slow()`)
	require.NoError(t, err)
	p := pgsql.PurgeSQL(pgx.Identifier{"items"}.Sanitize(), []string{"id"}, "old", "id")
	pctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	deleted, batches, err := p.Run(pctx, pool, 2, 0, 0)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(2), deleted, "the batch in flight finished and is counted")
	require.Equal(t, 1, batches)
	var left int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM items`).Scan(&left))
	require.Equal(t, 5-deleted, left)
}

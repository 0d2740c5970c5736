package pgsql_test

import (
	"context"
	"testing"

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

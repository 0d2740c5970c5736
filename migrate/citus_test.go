package migrate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/migrate"
)

// Without Citus, Distribute says so and changes nothing.
func TestDistribute_NeedsCitus(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("the database has Citus")
	}
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	res, err := migrate.Distribute(ctx, pool, schema, nil)
	require.ErrorIs(t, err, migrate.ErrNotCitus)
	require.Empty(t, res.Placed)
}

// placement is how Citus holds a table: "h:" its distribution column and its
// colocation group for a distributed table, "local" for a Citus local table.
func placement(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) (string, int64) {
	t.Helper()
	var method, column, model string
	var group int64
	require.NoError(t, q.QueryRow(context.Background(), `SELECT partmethod::text, coalesce(column_to_column_name(logicalrelid, partkey), ''), colocationid, repmodel::text
		FROM pg_dist_partition WHERE logicalrelid = $1::regclass`, table).Scan(&method, &column, &group, &model), table)
	if method == "n" && model == "s" {
		return "local", 0
	}
	return method + ":" + column, group
}

// On Citus, Up distributes the ledger's and the webhook receiver's tables by tenant in
// one colocation group and makes the inbox's and the outbox's Citus local tables;
// Distribute moves the distributed ones into the group of a user's table.
func TestDistribute_Colocates(t *testing.T) {
	t.Parallel()
	pgtest.CitusCluster(t)
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	q := func(table string) string { return pgx.Identifier{schema, table}.Sanitize() }

	records, group := placement(t, pool, q("idempotency_records"))
	require.Equal(t, "h:tenant", records)
	versions, vgroup := placement(t, pool, q("entity_versions"))
	require.Equal(t, "h:tenant", versions)
	require.Equal(t, group, vgroup)
	for _, table := range []string{"inbox_messages", "outbox_events"} {
		kind, _ := placement(t, pool, q(table))
		require.Equal(t, "local", kind, table)
	}

	// A business table in a group of its own, as a table distributed with
	// colocate_with => 'none' is.
	_, err = pool.Exec(ctx, `CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, balance bigint NOT NULL, PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT create_distributed_table('accounts', 'tenant', colocate_with => 'none')`)
	require.NoError(t, err)
	_, agroup := placement(t, pool, q("accounts"))
	require.NotEqual(t, group, agroup)

	res, err := migrate.Distribute(ctx, pool, schema, &migrate.DistributeOpts{ColocateWith: q("accounts")})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{schema + ".idempotency_records", schema + ".entity_versions", schema + ".agent_calls"}, res.Placed)
	for _, table := range []string{"idempotency_records", "entity_versions", "agent_calls"} {
		_, g := placement(t, pool, q(table))
		require.Equal(t, agroup, g, table)
	}

	t.Run("Again", func(t *testing.T) {
		res, err := migrate.Distribute(ctx, pool, schema, &migrate.DistributeOpts{ColocateWith: q("accounts")})
		require.NoError(t, err)
		require.Empty(t, res.Placed)
		_, err = migrate.Up(ctx, pool, schema)
		require.NoError(t, err)
		_, g := placement(t, pool, q("idempotency_records"))
		require.Equal(t, agroup, g)
	})
}

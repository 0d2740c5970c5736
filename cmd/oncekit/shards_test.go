package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/shard"
)

// With shards, each command runs on every shard in turn, under a heading, or on --shard
// alone; a record is found on the shard that has it; a shard that is down fails the
// command after the others ran.
func TestShards(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("shards are independent PostgreSQL clusters")
	}
	ctx := context.Background()
	pools, schema, clusters := pgtest.Shards(t, 2)
	urls := []string{pgtest.URL(t), clusters[0].ConnString()}
	env := []string{"ONCEKIT_SHARDS=a=" + urls[0] + "; b=" + urls[1]}
	run := func(args ...string) result { return oncekit(t, env, append(args, "--schema", schema)...) }

	r := run("migrate")
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "== shard a ==")
	require.Contains(t, r.out, "== shard b ==")
	for _, p := range pools {
		v, err := migrate.Versions(ctx, p, schema)
		require.NoError(t, err)
		require.NotZero(t, v[ledger.MigrationLine], "each shard migrated")
	}

	router, err := shard.New([]shard.Shard{{Name: "a", Pool: pools[0]}, {Name: "b", Pool: pools[1]}},
		shard.Map(map[string]string{"acme": "a", "globex": "b"}, nil))
	require.NoError(t, err)
	l, err := ledger.NewSharded(router, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	for _, tenant := range []string{"acme", "globex"} {
		_, err := l.Do(ctx, intent(t, tenant, "orders.create", "k-"+tenant), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Code: 201}, nil
		}, nil)
		require.NoError(t, err)
	}

	r = run("list")
	require.Equal(t, 0, r.code, r.errOut)
	a, b := strings.Index(r.out, "== shard a =="), strings.Index(r.out, "== shard b ==")
	require.True(t, a >= 0 && b > a, r.out)
	require.Contains(t, r.out[a:b], "k-acme")
	require.Contains(t, r.out[b:], "k-globex")

	r = run("list", "--shard", "b")
	require.Equal(t, 0, r.code, r.errOut)
	require.NotContains(t, r.out, "k-acme")
	require.Contains(t, r.out, "k-globex")

	r = run("inspect", "globex", "orders.create", "k-globex")
	require.Equal(t, 0, r.code, "found on shard b, not found on a is no failure: %s", r.errOut)
	require.Contains(t, r.out, "k-globex")
	require.Empty(t, r.errOut)
	r = run("inspect", "initech", "orders.create", "k")
	require.Equal(t, exitNotFound, r.code)
	require.Equal(t, 1, strings.Count(r.errOut, "no record"), "said once: %s", r.errOut)

	r = run("status", "--json")
	require.Equal(t, exitUsage, r.code, "--json prints one document")
	r = run("status", "--json", "--shard", "a")
	require.Equal(t, 0, r.code, r.errOut)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &doc), r.out)

	require.Equal(t, exitUsage, run("status", "--shard", "c").code)
	require.Equal(t, exitUsage, run("status", "--database-url", urls[0]).code)
	require.Equal(t, exitUsage, oncekit(t, []string{"ONCEKIT_SHARDS=a"}, "status").code)
	require.Equal(t, exitUsage, oncekit(t, nil, "status", "--shard", "a").code)
	r = oncekit(t, nil, "status", "--schema", schema, "--shard-url", "a="+urls[0], "--shard-url", "a="+urls[1])
	require.Equal(t, exitUsage, r.code, "a name given twice")

	r = run("version")
	require.Equal(t, 0, r.code, r.errOut)
	require.NotContains(t, r.out, "== shard", "a command without a database runs once")

	require.NoError(t, clusters[0].Stop())
	r = run("status")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.out, "== shard a ==", "shard a reported though b is down")
	require.Contains(t, r.errOut, "oncekit: shard b: cannot reach shard")
	r = run("status", "--shard", "a")
	require.Equal(t, 0, r.code, r.errOut)
	r = run("list")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.out, "k-acme", "the live shard's records are listed though b is down")
	require.Contains(t, r.errOut, "shard b")
}

package shard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/shard"
)

// lazyPool is a pool that never connects: routing needs none.
func lazyPool(t *testing.T, db string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/"+db)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// Hash's placements are part of the contract: a tenant must stay on its shard across
// versions, or its retries would run its side effects again.
func TestHash_PlacementsAreStable(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"acme": "us", "globex": "eu", "initech": "ap", "umbrella": "eu",
		"tenant-0": "ap", "tenant-1": "eu", "tenant-2": "ap", "default": "ap",
	}
	for _, names := range [][]string{{"eu", "us", "ap"}, {"ap", "eu", "us"}, {"us", "ap", "eu"}} {
		pick := shard.Hash(names...)
		for tenant, s := range want {
			got, err := pick(tenant)
			require.NoError(t, err)
			require.Equal(t, s, got, "tenant %s with shards listed as %v", tenant, names)
		}
	}
}

// Adding a shard moves only the tenants the new shard takes.
func TestHash_AddingAShardMovesOnlyItsTenants(t *testing.T) {
	t.Parallel()
	before, after := shard.Hash("eu", "us", "ap"), shard.Hash("eu", "us", "ap", "sa")
	moved, spread := 0, map[string]int{}
	const n = 3000
	for i := range n {
		tenant := fmt.Sprintf("tenant-%d", i)
		b, _ := before(tenant)
		a, _ := after(tenant)
		spread[b]++
		if a != b {
			require.Equal(t, "sa", a, "a moved tenant goes to the new shard")
			moved++
		}
	}
	require.InDelta(t, n/4, moved, n/10, "about a quarter of the tenants move")
	for name, k := range spread {
		require.InDelta(t, n/3, k, n/10, "shard %s takes about a third of the tenants", name)
	}
	_, err := shard.Hash()("acme")
	require.Error(t, err)
}

func TestMap(t *testing.T) {
	t.Parallel()
	pick := shard.Map(map[string]string{"acme": "us"}, shard.Hash("eu"))
	s, err := pick("acme")
	require.NoError(t, err)
	require.Equal(t, "us", s)
	s, err = pick("globex")
	require.NoError(t, err)
	require.Equal(t, "eu", s)
	_, err = shard.Map(map[string]string{"acme": "us"}, nil)("globex")
	require.Error(t, err)
}

func TestRouter(t *testing.T) {
	t.Parallel()
	eu, us := lazyPool(t, "eu"), lazyPool(t, "us")
	r, err := shard.New([]shard.Shard{{Name: "eu", Pool: eu}, {Name: "us", Pool: us}},
		shard.Map(map[string]string{"acme": "eu", "globex": "us", "initech": "ap"}, nil))
	require.NoError(t, err)
	p, err := r.Pool("acme")
	require.NoError(t, err)
	require.Same(t, eu, p)
	s, err := r.For("globex")
	require.NoError(t, err)
	require.Equal(t, "us", s.Name)
	require.Same(t, us, s.Pool)

	_, err = r.For("initech") // placed on a shard the router lacks
	var ue *shard.UnroutableError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, shard.UnroutableError{Tenant: "initech", Shard: "ap"}, *ue)
	require.ErrorIs(t, err, shard.ErrUnroutable)
	_, err = r.Pool("umbrella") // placed nowhere
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "umbrella", ue.Tenant)
	require.Error(t, ue.Err)
	require.ErrorIs(t, err, shard.ErrUnroutable)

	got, ok := r.Shard("us")
	require.True(t, ok)
	require.Same(t, us, got.Pool)
	_, ok = r.Shard("ap")
	require.False(t, ok)
	shards := r.Shards()
	require.Equal(t, []string{"eu", "us"}, []string{shards[0].Name, shards[1].Name})
	shards[0].Name = "changed"
	require.Equal(t, "eu", r.Shards()[0].Name, "Shards returns a copy")

	var visited []string
	err = r.Each(func(s shard.Shard) error {
		visited = append(visited, s.Name)
		return errors.New("down")
	})
	require.Equal(t, []string{"eu", "us"}, visited, "Each visits every shard whatever some return")
	require.ErrorContains(t, err, `shard "eu": down`)
	require.ErrorContains(t, err, `shard "us": down`)

	// A nil picker hashes over the shards' names.
	r, err = shard.New([]shard.Shard{{Name: "eu", Pool: eu}, {Name: "us", Pool: us}, {Name: "ap", Pool: eu}}, nil)
	require.NoError(t, err)
	s, err = r.For("initech")
	require.NoError(t, err)
	require.Equal(t, "ap", s.Name)
}

func TestNew_Refuses(t *testing.T) {
	t.Parallel()
	p := lazyPool(t, "x")
	for name, shards := range map[string][]shard.Shard{
		"none":        nil,
		"nil pool":    {{Name: "eu"}},
		"same name":   {{Name: "eu", Pool: p}, {Name: "eu", Pool: p}},
		"nil pool #2": {{Name: "eu", Pool: p}, {Name: "us"}},
	} {
		_, err := shard.New(shards, nil)
		require.Error(t, err, name)
	}
	r := shard.Single(p)
	s, err := r.For("anyone")
	require.NoError(t, err)
	require.Same(t, p, s.Pool)
	require.NoError(t, r.Each(func(shard.Shard) error { return nil }))
	require.EqualError(t, r.Each(func(shard.Shard) error { return errors.New("down") }), "down", "one shard's error is not prefixed")
}

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/shard"
)

// envShards gives a worker the shards, NAME=URL entries separated by semicolons; unset,
// the worker runs on envDB alone.
const envShards = "PAYMENT_DEMO_SHARDS"

// shardName names shard i: a, b, c, ...
func shardName(i int) string { return string(rune('a' + i)) }

// shardTenant is the shop whose orders shard i holds: a tenant per shard, placed there
// by the demo's picker.
func shardTenant(i int) string { return "shop-" + shardName(i) }

// demoTenants are the shops of a run: one per shard; on Citus four, which Citus spreads
// over its workers; otherwise the one shop.
func demoTenants(shards int, citus bool) []string {
	if citus {
		shards = 4
	}
	if shards <= 1 {
		return []string{defaultShop}
	}
	tenants := make([]string, shards)
	for i := range tenants {
		tenants[i] = shardTenant(i)
	}
	return tenants
}

// demoPicker places each shop on its shard.
func demoPicker(n int) shard.Picker {
	m := map[string]string{}
	for i := range n {
		m[shardTenant(i)] = shardName(i)
	}
	return shard.Map(m, nil)
}

// shardsEnv is envShards's value for urls.
func shardsEnv(urls []string) string {
	entries := make([]string, len(urls))
	for i, u := range urls {
		entries[i] = shardName(i) + "=" + u
	}
	return strings.Join(entries, ";")
}

// openShards opens a pool on each shard of an envShards value, in the demo's schema,
// and the router over them.
func openShards(ctx context.Context, env string) (*shard.Router, func(), error) {
	var shards []shard.Shard
	closeAll := func() {
		for _, s := range shards {
			s.Pool.Close()
		}
	}
	for _, e := range strings.Split(env, ";") {
		name, url, _ := strings.Cut(e, "=")
		pool, err := demoPool(ctx, url)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		shards = append(shards, shard.Shard{Name: name, Pool: pool})
	}
	r, err := shard.New(shards, demoPicker(len(shards)))
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return r, closeAll, nil
}

// demoPool is a pool on url in the demo's schema.
func demoPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = demoSchema
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.MaxConns = 20
	return pgxpool.NewWithConfig(ctx, cfg)
}

// printPace prints, per shard, how many of oncekit's orders finished and how long a
// checkout took: the healthy shard's figures beside the crashed one's.
func printPace(w io.Writer, orders []Order, outcomes []outcome, shards int) {
	fmt.Fprintln(w, "\ncheckout time by shard (oncekit saga):")
	for i := range shards {
		var took []time.Duration
		unfinished := 0
		for j, o := range orders {
			oc := outcomes[j]
			if o.Tenant != shardTenant(i) || oc.unsubmitted {
				continue
			}
			if oc.unfinished {
				unfinished++
				continue
			}
			took = append(took, oc.took)
		}
		slices.Sort(took)
		q := func(p float64) time.Duration {
			if len(took) == 0 {
				return 0
			}
			return took[min(len(took)-1, int(p*float64(len(took))))].Round(time.Millisecond)
		}
		fmt.Fprintf(w, "  shard %s (%s): %d finished, %d unfinished; median %s, p95 %s, max %s\n",
			shardName(i), shardTenant(i), len(took), unfinished, q(0.5), q(0.95), q(1))
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/oncekit/oncekit/internal/pgtest"
)

// citusBench measures the guarded business transaction on a Citus cluster (a
// coordinator and two workers, the records and the business table distributed by
// tenant and colocated) beside the same on a single PostgreSQL, interleaved in the same
// rounds: each cluster's first_vs_bare, and what the coordinator's hop costs the bare
// transaction.
type citusBench struct {
	rounds, burst int
}

// citusScenarios are the ledger group's scenarios that Citus runs as they are: the
// floors and probes send statements about tables and locks that on Citus would run on
// the coordinator, not beside the records.
var citusScenarios = []string{"bare", "bare_again", "first", "first_default", "first_claim", "first_lookup", "replay", "replay_default"}

var citusRatios = [][3]string{
	{"noise", "bare_again", "bare"},
	{"first_vs_bare", "first", "bare"},
	{"first_default_vs_bare", "first_default", "bare"},
	{"first_claim_vs_bare", "first_claim", "bare"},
	{"first_lookup_vs_bare", "first_lookup", "bare"},
	{"replay_vs_first", "replay", "first"},
}

// citusOrders replaces the bench's orders table with one distributed by tenant beside the
// records; the tenant column's default routes the bench's INSERT to the tenant's shard.
const citusOrders = `DROP TABLE orders;
	CREATE TABLE orders (tenant text NOT NULL DEFAULT 'bench', id bigserial, item text NOT NULL, amount bigint NOT NULL, PRIMARY KEY (tenant, id));
	SELECT create_distributed_table('orders', 'tenant', colocate_with => '` + benchSchema + `.idempotency_records')`

func (b citusBench) run(ctx context.Context, out io.Writer) error {
	tarball, err := pgtest.CitusTarball()
	if err != nil {
		return err
	}
	if err := pgtest.EnsureCitus(ctx, tarball, os.Stderr); err != nil {
		return err
	}
	citus, err := pgtest.StartCitus(ctx, &pgtest.CitusOpts{Durable: true})
	if err != nil {
		return err
	}
	defer func() { _ = citus.Close() }()
	single, err := pgtest.StartCluster(ctx, clusterOpts())
	if err != nil {
		return err
	}
	defer func() { _ = single.Close() }()

	clusters := []struct{ name, url string }{{"citus", citus.ConnString()}, {"single", single.ConnString()}}
	var scens []scenario
	for _, c := range clusters {
		if err := setupSchema(ctx, c.url); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if c.name == "citus" {
			e, err := newEnv(ctx, c.url, 1, nil)
			if err != nil {
				return err
			}
			_, err = e.pool.Exec(ctx, citusOrders)
			e.pool.Close()
			if err != nil {
				return fmt.Errorf("distribute orders: %w", err)
			}
		}
		e, err := newEnv(ctx, c.url, 1, nil)
		if err != nil {
			return err
		}
		defer e.pool.Close()
		if err := e.seedReplays(ctx, 200); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		for _, s := range e.scenarios() {
			if slices.Contains(citusScenarios, s.name) {
				scens = append(scens, scenario{name: c.name + "." + s.name, op: s.op})
			}
		}
	}
	lat, err := interleave(ctx, b.rounds, b.burst, 1, scens)
	if err != nil {
		return err
	}
	figures := repeated{}
	var order []string
	for _, c := range clusters {
		for _, r := range citusRatios {
			name := fmt.Sprintf("citus.%s.%s", r[0], c.name)
			figures.add(name, lat[c.name+"."+r[1]]/lat[c.name+"."+r[2]])
			order = append(order, name)
		}
	}
	figures.add("citus.bare_citus_vs_single", lat["citus.bare"]/lat["single.bare"])
	figures.add("citus.first_citus_vs_single", lat["citus.first"]/lat["single.first"])
	order = append(order, "citus.bare_citus_vs_single", "citus.first_citus_vs_single")
	for _, c := range clusters {
		for _, s := range citusScenarios {
			name := fmt.Sprintf("citus.%s_us.%s", s, c.name)
			figures.add(name, lat[c.name+"."+s])
			order = append(order, name)
		}
	}
	figures.emit(func(s string) { fmt.Fprintln(out, s) }, order)
	return nil
}

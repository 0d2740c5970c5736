// Command bench measures the ledger side by side with the bare mutation on one
// PostgreSQL and prints one "metric <name> <value>" line per figure.
//
// It starts a throwaway durable cluster (fsync on, as in production) unless DATABASE_URL
// is set. Scenarios run interleaved, round by round, so machine noise falls on all of
// them alike; ratios compare medians of the rounds.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oncekit/oncekit/internal/pgtest"
)

func main() {
	quick := flag.Bool("quick", false, "run a few iterations only, to check the benchmark works")
	flag.Parse()
	if err := run(*quick); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(quick bool) error {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		c, err := pgtest.StartCluster(ctx, &pgtest.ClusterOpts{Durable: true})
		if err != nil {
			return err
		}
		defer c.Close()
		url = c.ConnString()
	}
	cfg := ledgerBench{url: url, rounds: 7, opsPerRound: 150}
	if quick {
		cfg.rounds, cfg.opsPerRound = 2, 10
	}
	start := time.Now()
	if err := cfg.run(ctx, os.Stdout); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: ledger done in %s\n", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	hb := httpBench{url: url, rounds: 7, opsPerRound: 150}
	if quick {
		hb.rounds, hb.opsPerRound = 2, 10
	}
	if err := hb.run(ctx, os.Stdout); err != nil {
		return fmt.Errorf("http: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench: http done in %s\n", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	ab := activityBench{url: url, rounds: 15}
	if quick {
		ab.rounds = 2
	}
	if err := ab.run(ctx, os.Stdout); err != nil {
		return fmt.Errorf("activity: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench: activity done in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

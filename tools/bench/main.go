// Command bench measures the ledger side by side with the bare mutation on one
// PostgreSQL and prints one "metric <name> <value>" line per figure.
//
// It starts a throwaway durable cluster (fsync on, as in production) unless DATABASE_URL
// is set. Scenarios run interleaved, round by round, so machine noise falls on all of
// them alike; ratios compare medians of the rounds.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/oncekit/oncekit/internal/pgtest"
)

func main() {
	quick := flag.Bool("quick", false, "run a few iterations only, to check the benchmark works")
	only := flag.String("only", "", "run one group only: ledger, http, messaging, activity, agent, or citus or scale (which run only when named)")
	flag.IntVar(&ledgerReps, "ledger-reps", 0, "the ledger group's repetitions, each on a fresh cluster (0: 4, or 1 with -quick)")
	flag.IntVar(&ledgerRounds, "ledger-rounds", 0, "the ledger group's rounds per repetition (0: 240, or 2 with -quick)")
	flag.Parse()
	if err := run(*quick, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// repeatedGroup runs a group once per repetition on a fresh server and prints each of
// its figures as the median over the repetitions, with their range.
func repeatedGroup(server func(context.Context) (string, func(), error), reps int,
	group func(url string) func(context.Context, io.Writer) error) func(context.Context, io.Writer) error {
	return func(ctx context.Context, out io.Writer) error {
		figures := repeated{}
		var order []string
		for range reps {
			url, done, err := server(ctx)
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			err = group(url)(ctx, &buf)
			done()
			if err != nil {
				return err
			}
			for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				var name string
				var v float64
				if _, err := fmt.Sscanf(line, "metric %s %g", &name, &v); err != nil {
					return fmt.Errorf("unexpected output %q", line)
				}
				if _, seen := figures[name]; !seen {
					order = append(order, name)
				}
				figures.add(name, v)
			}
		}
		figures.emit(func(s string) { fmt.Fprintln(out, s) }, order)
		return nil
	}
}

// clusterOpts are the settings of the clusters the groups measure on: durable, as in
// production, with pg_stat_statements loaded, when the server has it, but tracking
// nothing until the ledger group's server-time pass turns it on for its own connection.
func clusterOpts() *pgtest.ClusterOpts {
	o := &pgtest.ClusterOpts{Durable: true}
	if pgtest.HasLibrary("pg_stat_statements") {
		o.Settings = map[string]string{"shared_preload_libraries": "pg_stat_statements",
			"pg_stat_statements.track": "none", "pg_stat_statements.track_planning": "on"}
	}
	return o
}

// freshServer returns a fresh durable cluster for each call, or the DATABASE_URL
// server (with the schema recreated by each repetition) when it is set.
func freshServer(databaseURL string) func(context.Context) (string, func(), error) {
	return func(ctx context.Context) (string, func(), error) {
		if os.Getenv("DATABASE_URL") != "" {
			return databaseURL, func() {}, nil
		}
		c, err := pgtest.StartCluster(ctx, clusterOpts())
		if err != nil {
			return "", nil, err
		}
		return c.ConnString(), func() { _ = c.Close() }, nil
	}
}

// ledgerReps and ledgerRounds, when set, size the ledger group for a short run on a
// quiet machine.
var ledgerReps, ledgerRounds int

func run(quick bool, only string) error {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	// The scale and citus groups start clusters of their own.
	if url == "" && only != "scale" && only != "citus" {
		c, err := pgtest.StartCluster(ctx, clusterOpts())
		if err != nil {
			return err
		}
		defer c.Close()
		url = c.ConnString()
	}
	scale := func(full, small int) int {
		if quick {
			return small
		}
		return full
	}
	groups := []struct {
		name string
		run  func(context.Context, io.Writer) error
		// named says the group runs only when -only names it.
		named bool
	}{
		{"ledger", ledgerBench{server: freshServer(url), reps: cmp.Or(ledgerReps, scale(4, 1)), rounds: cmp.Or(ledgerRounds, scale(240, 2)), burst: 5,
			serverTime: os.Getenv("DATABASE_URL") == "" && clusterOpts().Settings != nil}.run, false},
		{"http", repeatedGroup(freshServer(url), scale(4, 1), func(url string) func(context.Context, io.Writer) error {
			return httpBench{url: url, rounds: scale(200, 2), opsPerRound: 5}.run
		}), false},
		{"messaging", repeatedGroup(freshServer(url), scale(4, 1), func(url string) func(context.Context, io.Writer) error {
			return messagingBench{url: url, rounds: scale(200, 2), opsPerRound: 5, dispatchN: scale(50000, 2000)}.run
		}), false},
		{"activity", activityBench{url: url, rounds: scale(15, 2)}.run, false},
		{"agent", repeatedGroup(freshServer(url), scale(4, 1), func(url string) func(context.Context, io.Writer) error {
			return agentBench{url: url, rounds: scale(200, 2), opsPerRound: 5}.run
		}), false},
		{name: "citus", named: true, run: citusBench{rounds: scale(300, 2), burst: 5}.run},
		{name: "scale", named: true, run: func(ctx context.Context, out io.Writer) error {
			sizes, err := scaleSizes()
			if err != nil {
				return err
			}
			return scaleBench{sizes: sizes, samples: scale(3000, 100), window: time.Duration(scale(60, 6)) * time.Second,
				outboxCap: time.Duration(scale(60, 5)) * time.Second}.run(ctx, out)
		}},
	}
	for _, g := range groups {
		if only != g.name && (only != "" || g.named) {
			continue
		}
		start := time.Now()
		if err := g.run(ctx, os.Stdout); err != nil {
			return fmt.Errorf("%s: %w", g.name, err)
		}
		fmt.Fprintf(os.Stderr, "bench: %s done in %s\n", g.name, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

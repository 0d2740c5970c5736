package main

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The demo's worker processes re-execute this test binary.
func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "worker" {
		workerMain()
	}
	os.Exit(m.Run())
}

// The demo, small: oncekit's saga ends clean under every fault, and the naive saga run
// beside it shows the duplicates the faults cause.
func TestDemo(t *testing.T) {
	t.Parallel()
	rep, err := run(config{orders: 40, concurrency: 40, naive: true, killEvery: 20, grace: time.Minute})
	require.NoError(t, err)
	require.True(t, rep.ok(), "oncekit saga")
	var naive tally
	for _, tl := range rep.tallies {
		if tl.mode == "naive" {
			naive = tl
		}
	}
	require.Positive(t, naive.dupCharges, "the faults were real: the naive saga charged twice")
	require.Positive(t, naive.dupShipments)
}

// The soak, short: orders submitted for 30 seconds, long enough for every fault kind to
// be injected into the servers at least once (the longest interval, an outage's, is at
// most 25 s with its jitter), and oncekit's saga still clean, with nothing left over.
// The faults stop with the submissions; the orders in flight then finish within the
// grace, as they would once an outage is over.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	if os.Getenv("DATABASE_URL") != "" || os.Getenv("TEMPORAL_ADDRESS") != "" {
		t.Skip("the soak injects faults into servers of its own; unset DATABASE_URL and TEMPORAL_ADDRESS")
	}
	// The grace is generous: on a busy machine an order whose record activity backed off
	// to the retry policy's one-minute cap under these faults may take minutes to finish.
	rep, err := run(config{orders: 100000, duration: 30 * time.Second, concurrency: 60, killEvery: 50, grace: 6 * time.Minute, seed: 7,
		faults: faultConfig{pgCrashEvery: 8 * time.Second, pgDown: time.Second, backendKillEvery: 2 * time.Second,
			outageEvery: 20 * time.Second, outage: 5 * time.Second, temporalEvery: 15 * time.Second}})
	require.NoError(t, err)
	require.True(t, rep.ok(), "oncekit saga under every fault kind")
	require.Greater(t, rep.tallies[0].orders, 50, "every fiftieth order, the second one first, kills the worker after its charge")
	require.Contains(t, rep.faults, "PostgreSQL crashes")
	for _, kind := range []string{" 0 PostgreSQL crashes", " 0 backend kills", " 0 outages", " 0 Temporal crashes"} {
		require.NotContains(t, rep.faults, kind, "every fault kind was injected at least once")
	}
}

// Over two shards, a shop on each and the second crash-restarted during the run: every
// order of both shops finishes clean, without a duplicate.
func TestShardsWithOneCrashed(t *testing.T) {
	t.Parallel()
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("shards are clusters of the demo's own; unset DATABASE_URL")
	}
	rep, err := run(config{orders: 60, concurrency: 30, killEvery: 20, grace: 2 * time.Minute, seed: 3, shards: 2,
		faults: faultConfig{shardCrashEvery: 4 * time.Second, shardDown: 2 * time.Second}})
	require.NoError(t, err)
	require.True(t, rep.ok(), "oncekit saga over two shards, one crash-restarted")
	require.Contains(t, rep.faults, "crashes of the last shard", "the shard was crashed")
	require.Len(t, rep.tallies, 1, "the naive saga knows no tenants and does not run over shards")
}

// An interrupted run (here, by -duration) stops submitting, waits for the orders in
// flight, and reports the ones it submitted; a grace too short to finish them leaves
// them unfinished, and the verdict says so with their IDs.
func TestInterruptedRun(t *testing.T) {
	t.Parallel()
	rep, err := run(config{orders: 2000, concurrency: 20, killEvery: 0, duration: 3 * time.Second, grace: time.Minute})
	require.NoError(t, err)
	got := rep.tallies[0]
	require.Positive(t, got.orders)
	require.Less(t, got.orders, 2000, "it stopped submitting")
	require.Zero(t, got.unfinished, "the orders in flight finished within the grace")
	require.True(t, rep.ok())

	rep, err = run(config{orders: 2000, concurrency: 20, killEvery: 0, duration: 2 * time.Second, grace: time.Millisecond})
	require.NoError(t, err)
	got = rep.tallies[0]
	require.Positive(t, got.unfinished+int(rep.runningWorkflow), "some orders were still in flight when the grace ran out")
	require.False(t, rep.ok(), "an unfinished run is not a clean one")
	require.NotEmpty(t, got.unclean)
}

// Setup and the report retry a failing step, and name it when they give up.
func TestRetryNamesTheStep(t *testing.T) {
	tries := 0
	require.NoError(t, retry(context.Background(), "set up", func() error {
		tries++
		if tries < 3 {
			return errors.New("terminating connection due to administrator command (SQLSTATE 57P01)")
		}
		return nil
	}))
	require.Equal(t, 3, tries)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := retry(ctx, "count the outcomes in the database", func() error { return errors.New("connection refused") })
	require.ErrorContains(t, err, "count the outcomes in the database: connection refused")
}

// The progress line names every fault kind and the last error seen.
func TestFaultCountsLine(t *testing.T) {
	var c faultCounts
	c.pgCrashes.Add(2)
	c.backendKills.Add(5)
	c.seen(errors.New("start checkout-1: connection refused"))
	require.Equal(t, "faults: 2 PostgreSQL crashes, 5 backend kills, 0 outages, 0 Temporal crashes; 1 errors seen (last: start checkout-1: connection refused)", c.String())
}

// A run stops injecting faults with its submissions, ended by -duration or by its last
// order: the orders in flight then finish after the last fault, instead of waiting out
// the retries' backoff under faults that outlast the run.
func TestFaultsStopWithTheSubmissions(t *testing.T) {
	t.Parallel()
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("the run crashes a PostgreSQL of its own; unset DATABASE_URL")
	}
	rep, err := run(config{orders: 2000, concurrency: 20, duration: 3 * time.Second, grace: 2 * time.Minute, seed: 11,
		faults: faultConfig{pgCrashEvery: 400 * time.Millisecond, pgDown: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.True(t, rep.ok(), "the orders in flight finished clean")
	require.NotContains(t, rep.injected, " 0 PostgreSQL crashes", "PostgreSQL was crashed while the orders were submitted")
	require.Equal(t, rep.injectedAtStop, rep.injected, "no fault started after the submissions stopped")

	// A run bounded by its orders stops them once the last order is submitted.
	rep, err = run(config{orders: 10, concurrency: 10, grace: time.Minute, seed: 12,
		faults: faultConfig{pgCrashEvery: 400 * time.Millisecond, pgDown: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.True(t, rep.ok(), "the orders finished clean")
	require.NotEmpty(t, rep.injectedAtStop, "the faults were stopped when the last order was submitted")
	require.Equal(t, rep.injectedAtStop, rep.injected, "no fault started after the last order was submitted")
}

package main

import (
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

// The soak, short: a few hundred orders with every fault kind injected into the servers
// at least once, and oncekit's saga still clean, with nothing left over.
func TestSoakShort(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" || os.Getenv("TEMPORAL_ADDRESS") != "" {
		t.Skip("the soak injects faults into servers of its own; unset DATABASE_URL and TEMPORAL_ADDRESS")
	}
	rep, err := run(config{orders: 200, concurrency: 60, killEvery: 50, grace: 2 * time.Minute, seed: 7,
		faults: faultConfig{pgCrashEvery: 8 * time.Second, pgDown: time.Second, backendKillEvery: 2 * time.Second,
			outageEvery: 20 * time.Second, outage: 5 * time.Second, temporalEvery: 15 * time.Second}})
	require.NoError(t, err)
	require.True(t, rep.ok(), "oncekit saga under every fault kind")
	require.Contains(t, rep.faults, "PostgreSQL crashes")
	for _, kind := range []string{" 0 PostgreSQL crashes", " 0 backend kills", " 0 outages", " 0 Temporal crashes"} {
		require.NotContains(t, rep.faults, kind, "every fault kind was injected at least once")
	}
}

package main

import (
	"os"
	"testing"

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
	rep, err := run(config{orders: 40, concurrency: 40, naive: true})
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

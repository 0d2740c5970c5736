package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestMain runs an agent process when the demo starts the test binary as one.
func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		if err := agentMain(role); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A short run of the demo: real agent processes and Temporal workers SIGKILLed after
// tool effects, a real Temporal dev server, real servers losing answers, tickets
// delivered twice. The oncekit agents, polling and on Temporal, have no duplicate and
// leave no ticket unfinished; the naive one, on the same faults, sends duplicates.
func TestDemo_Short(t *testing.T) {
	var out bytes.Buffer
	rep, err := run(context.Background(), config{tickets: 30, processes: 2, seed: 1, timeout: 2 * time.Minute}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.check(); err != nil {
		t.Fatal(err)
	}
	n := rep.cols[naiveAgent]
	if n.dupEmails+n.dupSMTP+n.dupRefunds == 0 {
		t.Fatal("the naive agent sent no duplicate under the same faults: the demo's faults did not strike")
	}
	if rep.cols[oncekitAgent].kill == 0 {
		t.Fatal("no oncekit agent process was SIGKILLed")
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// envMetrics names the directory where each worker process keeps its counts.
const envMetrics = "PAYMENT_DEMO_METRICS"

// metricsFlush is how often a worker writes its counts; a SIGKILLed worker loses at
// most this much.
const metricsFlush = 200 * time.Millisecond

// keepMetrics writes the counters' sums to its own file in dir until ctx ends.
func keepMetrics(ctx context.Context, sums func() map[string]int64, dir string) {
	if dir == "" {
		return
	}
	path := filepath.Join(dir, fmt.Sprintf("worker-%d.json", os.Getpid()))
	write := func() {
		b, _ := json.Marshal(sums())
		tmp := path + ".tmp"
		if os.WriteFile(tmp, b, 0o644) == nil {
			_ = os.Rename(tmp, path)
		}
	}
	t := time.NewTicker(metricsFlush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			write()
			return
		case <-t.C:
			write()
		}
	}
}

// printMetrics sums the workers' ledger calls by outcome and prints them: the guard at
// work under the injected faults, read from the ledger's own instruments.
func printMetrics(w io.Writer, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "worker-*.json"))
	if err != nil {
		return err
	}
	byOutcome := map[string]int64{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var sums map[string]int64
		if err := json.Unmarshal(b, &sums); err != nil {
			return err
		}
		for k, v := range sums {
			if !strings.HasPrefix(k, "oncekit.ledger.calls{") {
				continue
			}
			for _, attr := range strings.Split(strings.Trim(strings.TrimPrefix(k, "oncekit.ledger.calls"), "{}"), ",") {
				if outcome, ok := strings.CutPrefix(attr, "oncekit.outcome="); ok {
					byOutcome[outcome] += v
				}
			}
		}
	}
	fmt.Fprintf(w, "\noncekit's ledger, as its metrics saw it in %d worker processes (oncekit.ledger.calls; a worker's last %s before its SIGKILL is not counted):\n",
		len(files), metricsFlush)
	for _, row := range []struct{ outcome, what string }{
		{"first", "first executions and claims"},
		{"replay", "replays: a retry or a second submission got the stored answer"},
		{"redrive", "re-drives: a killed worker's claim taken over, the call made again with the same key"},
		{"uncertain", "calls reported as possibly made (an answer lost), re-driven by the retry"},
		{"in_progress", "refusals while another attempt held the key"},
		{"failed", "definitive failures stored"},
		{"key_reused", "keys reused with another payload"},
		{"lease_lost", "completions refused to a stale owner"},
	} {
		fmt.Fprintf(w, "  %8d  %s\n", byOutcome[row.outcome], row.what)
	}
	return nil
}

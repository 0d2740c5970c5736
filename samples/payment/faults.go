package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/devenv"
)

// faultConfig says which faults the demo injects into the servers it owns, besides the
// faults of its orders. A zero interval turns a kind off.
type faultConfig struct {
	pgCrashEvery     time.Duration // PostgreSQL crash restarts (immediate mode)
	pgDown           time.Duration // how long a crashed PostgreSQL stays down
	backendKillEvery time.Duration // one client backend terminated
	outageEvery      time.Duration // PostgreSQL down for outage
	outage           time.Duration
	temporalEvery    time.Duration // the Temporal dev server SIGKILLed and restarted
	shardCrashEvery  time.Duration // the last shard's PostgreSQL crash-restarted
	shardDown        time.Duration // how long a crashed shard stays down
	// A Citus worker crash-restarted, each in turn, and how long it stays down.
	citusWorkerCrashEvery, citusWorkerDown time.Duration
}

func (f faultConfig) any() bool {
	return f.pgCrashEvery > 0 || f.backendKillEvery > 0 || f.outageEvery > 0 || f.temporalEvery > 0 || f.shardCrashEvery > 0 ||
		f.citusWorkerCrashEvery > 0
}

// faultCounts counts the faults injected and the errors seen.
type faultCounts struct {
	pgCrashes, backendKills, outages, temporalCrashes atomic.Int64
	shardCrashes, citusWorkerCrashes                  atomic.Int64
	errors                                            atomic.Int64
	mu                                                sync.Mutex
	lastErr                                           string
	injecting                                         bool   // server faults are configured
	stopped                                           bool   // no fault starts any more (under mu)
	atStop                                            string // see submissionsStopped
}

// start reports whether a fault may start, false once stop was called, and counts it
// in n (nil: the fault counts itself) under the same lock, so that the counts stop
// also reads them.
func (c *faultCounts) start(n *atomic.Int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	if n != nil {
		n.Add(1)
	}
	return true
}

// stop lets no further fault start; a fault under way finishes.
func (c *faultCounts) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

// submissionsStopped keeps the faults injected so far (injected's figures), for
// stoppedAt.
func (c *faultCounts) submissionsStopped() {
	s := c.injected()
	c.mu.Lock()
	c.atStop = s
	c.mu.Unlock()
}

// stoppedAt returns the faults injected when the submissions stopped, "" if they ran
// to the last order.
func (c *faultCounts) stoppedAt() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.atStop
}

// any says whether there are faults or errors to speak of.
func (c *faultCounts) any() bool { return c.injecting || c.errors.Load() > 0 }

// progress is what the progress line adds: the faults and errors, when there are any.
func (c *faultCounts) progress() string {
	if !c.any() {
		return ""
	}
	return "; " + c.String()
}

func (c *faultCounts) seen(err error) {
	c.errors.Add(1)
	c.mu.Lock()
	c.lastErr = err.Error()
	if len(c.lastErr) > 120 {
		c.lastErr = c.lastErr[:120] + "..."
	}
	c.mu.Unlock()
}

func (c *faultCounts) String() string {
	s := c.injected()
	if n := c.errors.Load(); n > 0 {
		c.mu.Lock()
		s += fmt.Sprintf("; %d errors seen (last: %s)", n, c.lastErr)
		c.mu.Unlock()
	}
	return s
}

// injected counts the faults injected, of each kind.
func (c *faultCounts) injected() string {
	s := fmt.Sprintf("faults: %d PostgreSQL crashes, %d backend kills, %d outages, %d Temporal crashes",
		c.pgCrashes.Load(), c.backendKills.Load(), c.outages.Load(), c.temporalCrashes.Load())
	if n := c.shardCrashes.Load(); n > 0 {
		s += fmt.Sprintf(", %d crashes of the last shard", n)
	}
	if n := c.citusWorkerCrashes.Load(); n > 0 {
		s += fmt.Sprintf(", %d Citus worker crashes", n)
	}
	return s
}

// injectFaults injects fc's faults into env's servers until ctx ends. PostgreSQL crashes
// and outages take turns; each kind runs at its interval, jittered by rnd.
func injectFaults(ctx context.Context, env *devenv.Env, fc faultConfig, seed uint64, counts *faultCounts) {
	var pgMu sync.Mutex // one PostgreSQL fault at a time
	var wg sync.WaitGroup
	every := func(interval time.Duration, stream uint64, fault func() error) {
		if interval <= 0 {
			return
		}
		rnd := rand.New(rand.NewPCG(seed, stream))
		wg.Go(func() {
			for {
				jitter := time.Duration(rnd.Int64N(int64(interval)/2+1)) - interval/4
				t := time.NewTimer(interval + jitter)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				if err := fault(); err != nil && !errors.Is(err, context.Canceled) {
					counts.seen(fmt.Errorf("inject a fault: %w", err))
				}
			}
		})
	}
	pgFault := func(down time.Duration, n *atomic.Int64) func() error {
		return func() error {
			pgMu.Lock()
			defer pgMu.Unlock()
			if !counts.start(n) {
				return nil
			}
			return env.CrashPostgres(ctx, down)
		}
	}
	every(fc.pgCrashEvery, 1, pgFault(fc.pgDown, &counts.pgCrashes))
	every(fc.outageEvery, 2, pgFault(fc.outage, &counts.outages))
	killRnd := rand.New(rand.NewPCG(seed, 3))
	var killMu sync.Mutex
	every(fc.backendKillEvery, 4, func() error {
		if !pgMu.TryLock() {
			return nil // PostgreSQL is down or restarting
		}
		defer pgMu.Unlock()
		killMu.Lock()
		defer killMu.Unlock()
		if !counts.start(nil) {
			return nil
		}
		killed, err := env.KillBackend(ctx, func(n int) int { return killRnd.IntN(n) })
		if killed {
			counts.backendKills.Add(1)
		}
		return err
	})
	every(fc.temporalEvery, 5, func() error {
		if !counts.start(&counts.temporalCrashes) {
			return nil
		}
		return env.CrashTemporal(ctx, 2*time.Second)
	})
	every(fc.citusWorkerCrashEvery, 7, func() error {
		if !counts.start(&counts.citusWorkerCrashes) {
			return nil
		}
		n := counts.citusWorkerCrashes.Load()
		return env.CrashCitusWorker(ctx, int(n-1)%env.CitusWorkers(), fc.citusWorkerDown)
	})
	every(fc.shardCrashEvery, 6, func() error {
		if !counts.start(&counts.shardCrashes) {
			return nil
		}
		return env.CrashShard(ctx, len(env.ShardURLs)-1, fc.shardDown)
	})
	wg.Wait()
}

func (f faultConfig) String() string {
	var parts []string
	if f.pgCrashEvery > 0 {
		parts = append(parts, fmt.Sprintf("PostgreSQL crash-restarted every ~%s (down %s)", f.pgCrashEvery, f.pgDown))
	}
	if f.backendKillEvery > 0 {
		parts = append(parts, fmt.Sprintf("a backend killed every ~%s", f.backendKillEvery))
	}
	if f.outageEvery > 0 {
		parts = append(parts, fmt.Sprintf("a %s PostgreSQL outage every ~%s", f.outage, f.outageEvery))
	}
	if f.temporalEvery > 0 {
		parts = append(parts, fmt.Sprintf("the Temporal dev server SIGKILLed and restarted every ~%s", f.temporalEvery))
	}
	if f.shardCrashEvery > 0 {
		parts = append(parts, fmt.Sprintf("the last shard's PostgreSQL crash-restarted every ~%s (down %s)", f.shardCrashEvery, f.shardDown))
	}
	if f.citusWorkerCrashEvery > 0 {
		parts = append(parts, fmt.Sprintf("a Citus worker crash-restarted every ~%s (down %s)", f.citusWorkerCrashEvery, f.citusWorkerDown))
	}
	return strings.Join(parts, ", ")
}

package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// scenario is one way of doing the same work; op's i counts operations from 1.
type scenario struct {
	name string
	op   func(ctx context.Context, i int) error
}

// interleave runs every scenario opsPerRound times per client, round by round after a
// warm-up round, so machine noise falls on all of them alike, and returns each one's
// median time per operation in microseconds. With several clients, that is the
// clients' busy time per operation.
func interleave(ctx context.Context, rounds, opsPerRound, clients int, scens []scenario) (map[string]float64, error) {
	samples := map[string][]float64{}
	for round := -1; round < rounds; round++ {
		for _, s := range scens {
			var wg sync.WaitGroup
			var firstErr atomic.Value
			var counter atomic.Int64
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for range opsPerRound {
						if err := s.op(ctx, int(counter.Add(1))); err != nil {
							firstErr.CompareAndSwap(nil, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err, _ := firstErr.Load().(error); err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			if round >= 0 {
				samples[s.name] = append(samples[s.name], float64(time.Since(start).Microseconds())/float64(opsPerRound))
			}
		}
	}
	med := map[string]float64{}
	for name, xs := range samples {
		med[name] = median(xs)
	}
	return med, nil
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

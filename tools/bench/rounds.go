package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// scenario is one way of doing the same work; op's i counts operations from 1.
type scenario struct {
	name string
	op   func(ctx context.Context, i int) error
}

// interleave times every operation of every scenario and returns each scenario's
// median latency in microseconds. Each of clients goroutines runs rounds rounds after a
// warm-up round; in each round it runs a burst of burst operations of every scenario,
// the scenarios in a fresh random order. So machine noise, vacuum and checkpoints fall
// on all scenarios alike, and with several clients every scenario runs beside the
// same mix of the others.
func interleave(ctx context.Context, rounds, burst, clients int, scens []scenario) (map[string]float64, error) {
	var (
		mu       sync.Mutex
		samples  = map[string][]float64{}
		firstErr error
		counter  int
		wg       sync.WaitGroup
	)
	next := func() int {
		mu.Lock()
		defer mu.Unlock()
		counter++
		return counter
	}
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 0x0ce))
			local := map[string][]float64{}
			order := slices.Clone(scens)
			for round := -1; round < rounds; round++ {
				rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				for _, s := range order {
					for range burst {
						start := time.Now()
						if err := s.op(ctx, next()); err != nil {
							mu.Lock()
							if firstErr == nil {
								firstErr = fmt.Errorf("%s: %w", s.name, err)
							}
							mu.Unlock()
							return
						}
						if round >= 0 {
							local[s.name] = append(local[s.name], float64(time.Since(start).Nanoseconds())/1e3)
						}
					}
				}
			}
			mu.Lock()
			for name, xs := range local {
				samples[name] = append(samples[name], xs...)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
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
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)/2]
}

// repeated collects one figure per repetition and reports the median with its range.
type repeated map[string][]float64

func (r repeated) add(name string, v float64) { r[name] = append(r[name], v) }

// emit prints every figure, in the order first added, as
// "metric <name> <median>" followed by its range over the repetitions.
func (r repeated) emit(out func(string), order []string) {
	for _, name := range order {
		xs := r[name]
		if len(xs) == 0 {
			continue
		}
		lo, hi := slices.Min(xs), slices.Max(xs)
		out(fmt.Sprintf("metric %s %.4g range %.4g-%.4g n=%d", name, median(xs), lo, hi, len(xs)))
	}
}

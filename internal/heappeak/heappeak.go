// Package heappeak measures how much heap a piece of code holds at its peak, for tests
// that bound what hostile input costs: an oversized body, a stalled reader.
package heappeak

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// heapObjects is the metric behind runtime.MemStats.HeapAlloc: live objects and dead
// ones the collector has not freed yet. Read through runtime/metrics it costs no pause.
const heapObjects = "/memory/classes/heap/objects:bytes"

// Of runs f and returns the highest heap it saw above the heap before f, sampled every
// 100µs, and the bytes allocated meanwhile, which bound the peak from above whatever
// the collector does. It measures the whole process, so a test that calls it runs
// alone.
func Of(f func()) (peak, allocated uint64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	sample := []metrics.Sample{{Name: heapObjects}}
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	var top atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		s := []metrics.Sample{{Name: heapObjects}}
		tick := time.NewTicker(100 * time.Microsecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > base && v-base > top.Load() {
				top.Store(v - base)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	f()
	close(done)
	wg.Wait()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return top.Load(), after.TotalAlloc - before.TotalAlloc
}

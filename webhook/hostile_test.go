package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/webhook"
)

// A misconfigured secret is refused when the receiver is made, not discovered as a 401
// on every delivery.
func TestNew_RefusesUnusableSecrets(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.NewSchema(t)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	handle := func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }
	for name, v := range map[string]webhook.Verifier{
		"NotBase64":      webhook.StandardWebhooks{Secret: "whsec_not*base64!"},
		"NotBase64Ptr":   &webhook.StandardWebhooks{Secret: "whsec_%%%"},
		"Empty":          webhook.StandardWebhooks{},
		"GitHubNoSecret": webhook.GitHub(nil),
	} {
		_, err := webhook.New(&webhook.Config{Ledger: l, Verifier: v, Handle: handle, Source: "s"})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "secret", name)
	}
	_, err = webhook.New(&webhook.Config{Ledger: l, Verifier: webhook.StandardWebhooks{Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		Handle: handle, Source: "s"})
	require.NoError(t, err)
}

// zeros is a body of n zero bytes that holds no memory of its own, and counts what the
// server read of it.
type zeros struct {
	left int64
	read *atomic.Int64
}

func (z *zeros) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.left))
	clear(p[:n])
	z.left -= int64(n)
	z.read.Add(int64(n))
	return n, nil
}

// peakHeap runs f and returns the highest heap in use above the starting point,
// sampled every millisecond.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
				peak.Store(m.HeapAlloc - base)
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
	return peak.Load()
}

// Unauthenticated senders cannot make the receiver hold much memory: a declared length
// over the limit is refused before anything is read, and bodies under it are read a
// few at a time, each into one buffer of its declared size.
//
// It measures the process's heap, so it runs alone: no t.Parallel. Beside the parallel
// tests (one writes a 16 MiB body) the peak heap read 32.7 MiB for 8 refused posts.
func TestReceiver_HostileBodies(t *testing.T) {
	h := githubReceiver(t, webhook.Config{Handle: func(context.Context, pgx.Tx, webhook.Delivery) error {
		t.Error("a delivery with a bad signature reached the handler")
		return nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(size int64, read *atomic.Int64) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL, &zeros{left: size, read: read})
		require.NoError(t, err)
		req.ContentLength = size
		req.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
		req.Header.Set("X-GitHub-Delivery", "d-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0 // the server may close the connection before the whole body is sent
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name     string
		size     int64
		status   int
		maxPeak  uint64
		maxBytes int64
	}{
		// Over the 25 MiB limit: refused at once. Before the fix each was read to the
		// limit, growing by doubling.
		{"OverLimit", 30 << 20, http.StatusRequestEntityTooLarge, 16 << 20, 8 * (4 << 20)},
		// Under it: at most MaxConcurrentReadsDefault bodies in memory at once, 80 MiB
		// live. With GOGC=100 the heap may reach about twice what is live before the
		// collector runs (212 MiB was seen on a loaded machine), so the bound is three
		// times the live bodies: 240 MiB. Without the read slots, 8 bodies (160 MiB live)
		// reach about 320 MiB.
		{"UnderLimit", 20 << 20, http.StatusUnauthorized, 3 * webhook.MaxConcurrentReadsDefault * (20 << 20), 8 * (20 << 20)},
	} {
		var read atomic.Int64
		statuses := make(chan int, 8)
		peak := peakHeap(func() {
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() { statuses <- post(tc.size, &read) })
			}
			wg.Wait()
		})
		close(statuses)
		for s := range statuses {
			if s != 0 {
				require.Equal(t, tc.status, s, tc.name)
			}
		}
		t.Logf("%s: 8 concurrent %d MiB posts with bad signatures: peak heap %.1f MiB, %.1f MiB read",
			tc.name, tc.size>>20, float64(peak)/(1<<20), float64(read.Load())/(1<<20))
		require.Less(t, peak, tc.maxPeak, fmt.Sprintf("%s: peak heap", tc.name))
		require.LessOrEqual(t, read.Load(), tc.maxBytes, tc.name)
	}
}

// With ReadSlotWait set to ledger.NoWait, a delivery that finds every read slot taken is
// answered 503 at once instead of waiting for one.
func TestReceiver_NoWaitForReadSlot(t *testing.T) {
	t.Parallel()
	h := githubReceiver(t, webhook.Config{MaxConcurrentReads: 1, ReadSlotWait: ledger.NoWait,
		Handle: func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }})
	srv := httptest.NewServer(h)
	defer srv.Close()

	// The first delivery holds the only slot: its body never ends until released.
	pr, pw := io.Pipe()
	slow := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, pr)
		req.Header.Set("X-GitHub-Delivery", "d-slow")
		req.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			slow <- 0
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	// More than the sockets' buffers hold: the write returns only once the server has
	// taken the slot and is reading.
	if _, err := pw.Write(make([]byte, 16<<20)); err != nil {
		t.Fatalf("the slow delivery was answered %d before its body was read: %v", <-slow, err)
	}

	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	require.NoError(t, err)
	req.Header.Set("X-GitHub-Delivery", "d-fast")
	req.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.NoError(t, pw.Close())
	require.Equal(t, http.StatusUnauthorized, <-slow, "the slow delivery was read, then refused for its signature")
}

// githubReceiver is a GitHub receiver on a fresh schema, with cfg's other settings.
func githubReceiver(t *testing.T, cfg webhook.Config) http.Handler {
	t.Helper()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	cfg.Ledger, err = ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	cfg.Verifier, cfg.Source = webhook.GitHub(secret), "github"
	h, err := webhook.New(&cfg)
	require.NoError(t, err)
	return h
}

package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/heappeak"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/webhook"
)

// A misconfigured secret is refused when the receiver is made, not discovered as a 401
// on every delivery.
func TestNew_RefusesUnusableSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	handle := func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }
	for name, v := range map[string]webhook.Verifier{
		"NotBase64":      webhook.StandardWebhooks{Secret: "whsec_not*base64!"},
		"NotBase64Ptr":   &webhook.StandardWebhooks{Secret: "whsec_%%%"},
		"Empty":          webhook.StandardWebhooks{},
		"GitHubNoSecret": webhook.GitHub(nil),
	} {
		_, err := webhook.New(ctx, &webhook.Config{Ledger: l, Verifier: v, Handle: handle, Source: "s"})
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "secret", name)
	}
	_, err = webhook.New(ctx, &webhook.Config{Ledger: l, Verifier: webhook.StandardWebhooks{Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
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

// chunked hides a reader's type, so the client cannot learn its length and sends the
// body chunked.
type chunked struct{ io.Reader }

// Unauthenticated senders cannot make the receiver hold more than the documented bound,
// MaxConcurrentReads × MaxBodyBytes: a declared length over the limit is refused before
// anything is read, a declared length is read into one buffer of that size, and a body
// without one (chunked) into buffers that never pass the limit. Each case sends as many
// deliveries at once as there are read slots, so every body is read at the same time
// and the bound is reached.
//
// The heap is bounded by the documented bound plus 8 MiB: per delivery, the small
// buffers a body without Content-Length outgrows before its full-size one (under
// 512 KiB), and both ends' connection buffers (tens of KiB), with room for what the
// runtime and the test allocate meanwhile. Each case allocates less than that bound in
// all, so the peak stays under it whenever the collector runs; -race allocates the same
// bodies, so the bound is the same under it.
//
// It measures the process's heap, so it runs alone: no t.Parallel.
func TestReceiver_HostileBodies(t *testing.T) {
	h := githubReceiver(t, webhook.Config{Handle: func(context.Context, pgx.Tx, webhook.Delivery) error {
		t.Error("a delivery with a bad signature reached the handler")
		return nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()

	post := func(size int64, declare bool, read *atomic.Int64) int {
		var body io.Reader = &zeros{left: size, read: read}
		if !declare {
			body = chunked{body}
		}
		req, err := http.NewRequest(http.MethodPost, srv.URL, body)
		require.NoError(t, err)
		if declare {
			req.ContentLength = size
		}
		req.Header.Set("X-Hub-Signature-256", "sha256="+strings.Repeat("0", 64))
		req.Header.Set("X-GitHub-Delivery", "d-1")
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return 0 // the server may close the connection before the whole body is sent
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	const (
		limit = webhook.MaxBodyDefault
		slots = webhook.MaxConcurrentReadsDefault
		bound = slots*limit + 8<<20
	)
	for _, tc := range []struct {
		name    string
		senders int
		size    int64
		declare bool
		status  int
		maxPeak uint64
	}{
		// Over the limit, declared: refused before a byte is read, by as many senders as
		// the slots and more.
		{"DeclaredOverLimit", 2 * slots, limit + 5<<20, true, http.StatusRequestEntityTooLarge, 8 << 20},
		// At the limit, declared: each read into one buffer of its size.
		{"DeclaredAtLimit", slots, limit, true, http.StatusUnauthorized, bound},
		// Over the limit, chunked: read to the limit, then refused. Before the buffers
		// stopped at the limit, each doubled to 32 MiB: 192 MiB for four (240-296 MiB
		// under -race).
		{"ChunkedOverLimit", slots, limit + 5<<20, false, http.StatusRequestEntityTooLarge, bound},
		// Under the limit, chunked.
		{"ChunkedUnderLimit", slots, limit - 5<<20, false, http.StatusUnauthorized, bound},
	} {
		var read atomic.Int64
		statuses := make(chan int, tc.senders)
		peak, allocated := heappeak.Of(func() {
			var wg sync.WaitGroup
			for range tc.senders {
				wg.Go(func() { statuses <- post(tc.size, tc.declare, &read) })
			}
			wg.Wait()
		})
		close(statuses)
		for s := range statuses {
			if s != 0 {
				require.Equal(t, tc.status, s, tc.name)
			}
		}
		t.Logf("%s: %d concurrent %.0f MiB posts with bad signatures: peak heap +%.1f MiB (bound %.0f MiB), %.1f MiB allocated, %.1f MiB sent",
			tc.name, tc.senders, float64(tc.size)/(1<<20), float64(peak)/(1<<20), float64(tc.maxPeak)/(1<<20),
			float64(allocated)/(1<<20), float64(read.Load())/(1<<20))
		require.Less(t, peak, tc.maxPeak, fmt.Sprintf("%s: peak heap", tc.name))
	}
}

// Senders that send headers with a large Content-Length and then stall cannot lock a
// genuine delivery out: each read slot's read has a deadline, so a stalled sender loses
// its slot (408), and a delivery waiting for a slot takes the next one freed, ahead of
// senders that arrive after it. Four stallers that reconnect as soon as they are cut
// hold every slot, over and over, while the genuine delivery waits.
func TestReceiver_SlowSendersCannotLockOut(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	h := githubReceiver(t, webhook.Config{ReadSlotWait: 5 * time.Second, BodyReadTimeout: 200 * time.Millisecond,
		Handle: func(context.Context, pgx.Tx, webhook.Delivery) error {
			handled.Add(1)
			return nil
		}})
	entered := make(chan struct{}, 1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-GitHub-Delivery") == "stall" {
			entered <- struct{}{}
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var cut atomic.Int32
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stall := "POST / HTTP/1.1\r\nHost: receiver\r\nContent-Length: 1000000\r\nX-GitHub-Delivery: stall\r\n" +
		"X-Hub-Signature-256: sha256=" + strings.Repeat("0", 64) + "\r\n\r\n{"
	for range webhook.MaxConcurrentReadsDefault {
		wg.Go(func() {
			for ctx.Err() == nil {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					return
				}
				stop := context.AfterFunc(ctx, func() { conn.Close() })
				if _, err := io.WriteString(conn, stall); err == nil {
					// The server answers only once it gives up on the body.
					if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
						resp.Body.Close()
						if resp.StatusCode == http.StatusRequestTimeout {
							cut.Add(1)
						}
					}
				}
				stop()
				conn.Close()
			}
		})
	}
	for range webhook.MaxConcurrentReadsDefault {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the stalling senders never reached the receiver")
		}
	}

	body := []byte(`{"issue":"1","version":1,"title":"genuine"}`)
	req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-GitHub-Delivery", "genuine")
	req.Header.Set("X-Hub-Signature-256", sign(body))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the genuine delivery got a read slot")
	require.Equal(t, int32(1), handled.Load())
	// A slot freed for the genuine delivery when a stalled read was cut off; its sender
	// reads the 408 on its own goroutine, which may come after the genuine answer.
	require.Eventually(t, func() bool { return cut.Load() > 0 }, 30*time.Second, 5*time.Millisecond,
		"stalled senders were cut off with 408")
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
	h, err := webhook.New(context.Background(), &cfg)
	require.NoError(t, err)
	return h
}

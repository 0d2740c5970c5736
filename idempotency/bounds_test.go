package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/heappeak"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// A handler that writes far more than can be stored has its Write refused once the
// stored response would pass the limit, and the middleware holds no more than the
// limit's buffer meanwhile; the client gets 500 and nothing is stored.
//
// It measures the process's heap, so it runs alone: no t.Parallel.
func TestMiddleware_OversizedResponseIsRefusedAsWritten(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	mw, err := idempotency.New(&idempotency.Config{Ledger: l, TenantFunc: idempotency.FixedTenant("acme")})
	require.NoError(t, err)

	const written = 64 << 20
	var accepted int
	var writeErr error
	chunk := make([]byte, 32<<10)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		for accepted < written {
			n, err := w.Write(chunk)
			accepted += n
			if err != nil {
				writeErr = err
				return
			}
		}
	})))
	defer srv.Close()

	var status int
	var problem string
	peak, allocated := heappeak.Of(func() {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/export", nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", `"big"`)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		r := reply{status: resp.StatusCode, header: resp.Header}
		r.body = readAll(t, resp)
		status, problem = r.status, problemType(t, r)
	})
	t.Logf("a handler writing %d MiB against the %d MiB limit: %d bytes accepted, peak heap +%.1f MiB, %.1f MiB allocated",
		written>>20, idempotency.MaxResponseDefault>>20, accepted, float64(peak)/(1<<20), float64(allocated)/(1<<20))
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, idempotency.ProblemResponseTooLarge, problem)
	require.ErrorIs(t, writeErr, idempotency.ErrResponseTooLarge, "the handler learns at its Write")
	require.LessOrEqual(t, accepted, idempotency.MaxResponseDefault)
	// The buffer doubles up to the limit, so what it allocates in all is under twice the
	// limit; 2 MiB more covers the request, the ledger's round trips and the problem.
	// Before the limit was checked as bytes arrive, the heap grew by about 224 MiB.
	bound := uint64(2*idempotency.MaxResponseDefault + 2<<20)
	require.Less(t, peak, bound, "peak heap")
	require.Less(t, allocated, bound, "bytes allocated")
	var n int
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.idempotency_records`, schema)).Scan(&n))
	require.Zero(t, n, "nothing stored")
}

// A retry that arrives after its record expired is a new intent and runs the handler
// again: once. The test counts the handler's calls, not committed rows, since a call
// that runs the handler twice still commits once, and a handler that calls a payment
// API would charge twice.
func TestMiddleware_RetryAfterExpiryRunsHandlerOnce(t *testing.T) {
	t.Parallel()
	clock := pgtest.ClockAt(time.Now().Truncate(time.Microsecond))
	b := setupWithLedger(t, &ledger.Config{Retention: time.Hour, Test: ledger.TestConfig{NowFunc: clock.Now}}, nil)

	first := b.post(t, "acme", `"late"`, `{"item":"book"}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "true", b.post(t, "acme", `"late"`, `{"item":"book"}`).header.Get("Idempotency-Replayed"))
	require.Equal(t, int64(1), b.handlerCalls())

	clock.Advance(time.Hour + time.Minute)
	late := b.post(t, "acme", `"late"`, `{"item":"book"}`)
	require.Equal(t, http.StatusCreated, late.status)
	require.Empty(t, late.header.Get("Idempotency-Replayed"), "an expired record is absent")
	require.NotEqual(t, first.body, late.body)
	require.Equal(t, int64(2), b.handlerCalls(), "the late retry ran the handler once")

	again := b.post(t, "acme", `"late"`, `{"item":"book"}`)
	require.Equal(t, "true", again.header.Get("Idempotency-Replayed"))
	require.Equal(t, late.body, again.body)
	require.Equal(t, int64(2), b.handlerCalls())
	require.Equal(t, 2, b.orders(t))
}

package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	srv    *httptest.Server
	pool   *pgxpool.Pool
	schema string
	calls  *int64
	mu     *sync.Mutex
	// holding receives when a request for the item "held" is in the handler, which then
	// waits until release is closed.
	holding chan struct{}
	release chan struct{}
}

// setup serves POST /orders, which inserts an order through the ledger's transaction
// and answers 201 with a body that differs on every execution (a fresh order ID and
// the time), so a replay is recognisable.
func setup(t *testing.T, configure func(*idempotency.Config)) *bundle {
	t.Helper()
	return setupWithLedger(t, &ledger.Config{MaxBodyBytes: 4096}, configure)
}

// setupWithLedger is setup with the ledger configured by lcfg (its Schema is set here).
func setupWithLedger(t *testing.T, lcfg *ledger.Config, configure func(*idempotency.Config)) *bundle {
	t.Helper()
	return setupOn(t, lcfg, configure, nil)
}

// setupOn is setupWithLedger with the ledger on the pool ledgerPool returns for the
// test's schema (nil: the test's own pool).
func setupOn(t *testing.T, lcfg *ledger.Config, configure func(*idempotency.Config), ledgerPool func(schema string) *pgxpool.Pool) *bundle {
	t.Helper()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(ledger.Migrate),
		`CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, item text NOT NULL)`)
	lc := *lcfg
	lc.Schema = schema
	lp := pool
	if ledgerPool != nil {
		lp = ledgerPool(schema)
	}
	l, err := ledger.New(lp, &lc)
	require.NoError(t, err)
	b := &bundle{pool: pool, schema: schema, calls: new(int64), mu: &sync.Mutex{},
		holding: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := &idempotency.Config{Ledger: l, TenantFunc: func(r *http.Request) (string, error) {
		if c := r.Header.Get("X-Client"); c != "" {
			return c, nil
		}
		return "", fmt.Errorf("no X-Client header")
	}}
	if configure != nil {
		configure(cfg)
	}
	mw, err := idempotency.New(cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		*b.calls++
		b.mu.Unlock()
		var req struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Item == "" {
			http.Error(w, `{"error":"item required"}`, http.StatusUnprocessableEntity)
			return
		}
		if req.Item == "explode" {
			tx, _ := idempotency.Tx(r)
			_, _ = tx.Exec(r.Context(), `INSERT INTO orders (tenant, item) VALUES ($1, $2)`, r.Header.Get("X-Client"), req.Item)
			http.Error(w, "database on fire", http.StatusInternalServerError)
			return
		}
		tx, ok := idempotency.Tx(r)
		if !ok {
			http.Error(w, "no tx", http.StatusInternalServerError)
			return
		}
		if req.Item == "slow" {
			time.Sleep(100 * time.Millisecond)
		}
		if req.Item == "held" {
			b.holding <- struct{}{}
			<-b.release
		}
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (tenant, item) VALUES ($1, $2) RETURNING id`, r.Header.Get("X-Client"), req.Item).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.Header().Set("X-Not-Replayed", "only-first")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"item":%q,"at":%q}`, id, req.Item, time.Now().Format(time.RFC3339Nano))
	})))
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

// handlerCalls is how many times the handler has run.
func (b *bundle) handlerCalls() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *b.calls
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return body
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (b *bundle) post(t testing.TB, client, key, body string, extra ...[2]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for _, h := range extra {
		req.Header.Add(h[0], h[1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}
}

func (b *bundle) orders(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	return n
}

func (b *bundle) records(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()).Scan(&n))
	return n
}

func problemType(t testing.TB, r reply) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, r.status, p.Status)
	return p.Type
}

// The server commits but the response never reaches the client: the retry gets the
// same response, byte for byte, marked as a replay, and the order exists once.
func TestMiddleware_ResponseLostRetryReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.post(t, "acme", `"k-1"`, `{"item":"book"}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "only-first", first.header.Get("X-Not-Replayed"))
	require.Empty(t, first.header.Get("Idempotency-Replayed"))

	again := b.post(t, "acme", `"k-1"`, "{\n  \"item\": \"book\"\n}") // same JSON, other spacing
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, first.body, again.body, "byte-equal body")
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.Equal(t, "application/json", again.header.Get("Content-Type"))
	require.Equal(t, "true", again.header.Get("Idempotency-Replayed"))
	require.Empty(t, again.header.Get("X-Not-Replayed"), "only allow-listed headers are replayed")
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, int64(1), *b.calls)
}

// 50 identical requests race with one key: one order, and every client gets the same
// answer.
func TestMiddleware_ConcurrentIdenticalRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idempotency.Config) { c.Wait = 30 * time.Second })
	var wg sync.WaitGroup
	replies := make([]reply, 50)
	start := make(chan struct{})
	for i := range replies {
		wg.Go(func() {
			<-start
			replies[i] = b.post(t, "acme", `"race"`, `{"item":"slow"}`)
		})
	}
	close(start)
	wg.Wait()
	for _, r := range replies {
		require.Equal(t, http.StatusCreated, r.status, string(r.body))
		require.Equal(t, replies[0].body, r.body)
	}
	require.Equal(t, 1, b.orders(t))
}

// Without a wait, a duplicate of an in-flight request gets 409 with Retry-After.
func TestMiddleware_InFlightDuplicateGets409(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := sync.OnceFunc(func() { close(b.release) })
	t.Cleanup(release)
	first := make(chan reply, 1)
	go func() { first <- b.post(t, "acme", `"dup"`, `{"item":"held"}`) }()
	select {
	case <-b.holding: // the first request holds the key, in its handler
	case <-time.After(time.Minute):
		t.Fatal("the first request did not reach its handler")
	}
	var wg sync.WaitGroup
	replies := make([]reply, 8)
	for i := range replies {
		wg.Go(func() { replies[i] = b.post(t, "acme", `"dup"`, `{"item":"held"}`) })
	}
	wg.Wait()
	release()
	for _, r := range replies {
		require.Equal(t, http.StatusConflict, r.status, string(r.body))
		require.Equal(t, idempotency.ProblemInProgress, problemType(t, r))
		require.Equal(t, "1", r.header.Get("Retry-After"))
	}
	require.Equal(t, http.StatusCreated, (<-first).status)
	require.Equal(t, 1, b.orders(t))
}

// The same key with a different payload is refused with 422, and nothing runs.
func TestMiddleware_SameKeyDifferentPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	require.Equal(t, http.StatusCreated, b.post(t, "acme", `"k-2"`, `{"item":"book"}`).status)
	r := b.post(t, "acme", `"k-2"`, `{"item":"lamp"}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.Equal(t, idempotency.ProblemKeyReused, problemType(t, r))
	require.Equal(t, int64(1), *b.calls)
	require.Equal(t, 1, b.orders(t))
}

// A key from one client never returns another client's stored response.
func TestMiddleware_TenantsAreIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := b.post(t, "client-a", `"shared"`, `{"item":"book"}`)
	c := b.post(t, "client-b", `"shared"`, `{"item":"book"}`)
	require.Equal(t, http.StatusCreated, c.status)
	require.Empty(t, c.header.Get("Idempotency-Replayed"))
	require.NotEqual(t, a.body, c.body)
	require.Equal(t, 2, b.orders(t))
	r := b.post(t, "", `"shared"`, `{"item":"book"}`)
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Equal(t, idempotency.ProblemTenant, problemType(t, r))
}

// 5xx is not stored: the handler's writes roll back and the key stays free. A
// definitive 4xx is stored and replayed.
func TestMiddleware_WhichOutcomesAreStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.post(t, "acme", `"k-5xx"`, `{"item":"explode"}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Equal(t, 0, b.orders(t), "the 5xx handler's write was rolled back")
	require.Equal(t, 0, b.records(t))
	r = b.post(t, "acme", `"k-5xx"`, `{"item":"explode"}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Equal(t, int64(2), *b.calls, "the retry ran again")

	r = b.post(t, "acme", `"k-4xx"`, `{"item":""}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	r2 := b.post(t, "acme", `"k-4xx"`, `{"item":""}`)
	require.Equal(t, http.StatusUnprocessableEntity, r2.status)
	require.Equal(t, "true", r2.header.Get("Idempotency-Replayed"))
	require.Equal(t, r.body, r2.body)
	require.Equal(t, int64(3), *b.calls)
}

// Bad input gets a clear problem, nothing runs and nothing is stored.
func TestMiddleware_BadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idempotency.Config) { c.MaxBodyBytes = 64 })
	for _, tc := range []struct {
		name, key, body string
		extra           [][2]string
		status          int
		problem         string
	}{
		{"MissingKey", "", `{"item":"x"}`, nil, 400, idempotency.ProblemKeyMissing},
		{"TwoHeaders", `"a"`, `{"item":"x"}`, [][2]string{{"Idempotency-Key", `"b"`}}, 400, idempotency.ProblemKeyInvalid},
		{"TwoInOneHeader", `"a", "b"`, `{"item":"x"}`, nil, 400, idempotency.ProblemKeyInvalid},
		{"TooLong", `"` + strings.Repeat("k", 256) + `"`, `{"item":"x"}`, nil, 400, idempotency.ProblemKeyInvalid},
		{"Unterminated", `"abc`, `{"item":"x"}`, nil, 400, idempotency.ProblemKeyInvalid},
		{"EmptyString", `""`, `{"item":"x"}`, nil, 400, idempotency.ProblemKeyInvalid},
		{"MalformedJSON", `"k"`, `{"item":`, nil, 400, idempotency.ProblemBodyMalformed},
		{"BodyTooLarge", `"k"`, `{"item":"` + strings.Repeat("x", 100) + `"}`, nil, 413, idempotency.ProblemBodyTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := b.post(t, "acme", tc.key, tc.body, tc.extra...)
			require.Equal(t, tc.status, r.status, string(r.body))
			require.Equal(t, tc.problem, problemType(t, r))
		})
	}
	require.Equal(t, int64(0), *b.calls)
	require.Equal(t, 0, b.records(t))
}

func TestMiddleware_UnquotedTokenAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := b.post(t, "acme", `8e03978e-40d5-43e8-bc93-6894a57f9324`, `{"item":"pen"}`)
	c := b.post(t, "acme", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"item":"pen"}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "true", c.header.Get("Idempotency-Replayed"), "a token and the same string are one key")
	require.True(t, bytes.Equal(a.body, c.body))
}

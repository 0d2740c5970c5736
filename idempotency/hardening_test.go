package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// targets serves a few routes behind the middleware, each writing one row to "effects"
// through the ledger's transaction, so a test can see what committed.
type targets struct {
	srv    *httptest.Server
	pool   *pgxpool.Pool
	schema string
	ledger *ledger.Ledger
}

func setupTargets(t *testing.T, configure func(*idempotency.Config), guardMux bool) *targets {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, what text NOT NULL)`)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema, OperationRetention: map[string]time.Duration{"POST /orders": 2 * time.Hour}})
	require.NoError(t, err)
	cfg := &idempotency.Config{Ledger: l, TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }}
	if configure != nil {
		configure(cfg)
	}
	mw, err := idempotency.New(cfg)
	require.NoError(t, err)
	write := func(r *http.Request, what string) error {
		tx, ok := idempotency.Tx(r)
		if !ok {
			return fmt.Errorf("no transaction")
		}
		_, err := tx.Exec(r.Context(), `INSERT INTO effects (what) VALUES ($1)`, what)
		return err
	}
	guard := func(h http.HandlerFunc) http.Handler {
		if guardMux {
			return h
		}
		return mw(h)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/refund", guard(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := write(r, "refund "+id+" "+r.URL.Query().Get("amount")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"refunded_order":%q}`, id)
	}))
	mux.Handle("POST /orders", guard(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r, "order"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	mux.Handle("POST /prg", guard(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r, "prg"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		http.Redirect(w, r, "/orders/7", http.StatusSeeOther)
	}))
	mux.Handle("POST /hints", guard(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		if err := write(r, "hints"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("created"))
	}))
	mux.Handle("POST /ok", guard(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r, "ok"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("done"))
	}))
	mux.Handle("POST /gzip", guard(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r, "gzip"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write([]byte(`{"compressed":true}`))
		_ = zw.Close()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(zb.Bytes())
	}))
	mux.Handle("POST /", guard(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r, "any "+r.URL.Path); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	var h http.Handler = mux
	if guardMux {
		h = mw(mux)
	}
	tg := &targets{srv: httptest.NewServer(h), pool: pool, schema: schema, ledger: l}
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *targets) post(t *testing.T, target, key, client, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, tg.srv.URL+target, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client", client)
	req.Header.Set("Idempotency-Key", key)
	// Keep the raw answer: the transport must not undo a Content-Encoding.
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}
}

func (tg *targets) effects(t *testing.T, what string) int {
	t.Helper()
	var n int
	require.NoError(t, tg.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE what = $1`, what).Scan(&n))
	return n
}

// A key reused on another resource, or with another query, is refused as a reused key:
// never answered with the first resource's stored response.
func TestMiddleware_KeyReusedOnAnotherTarget(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, nil, false)
	first := tg.post(t, "/orders/1/refund", "k", "acme", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.JSONEq(t, `{"refunded_order":"1"}`, string(first.body))

	other := tg.post(t, "/orders/2/refund", "k", "acme", `{}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.status)
	require.Equal(t, idempotency.ProblemKeyReused, problemType(t, other))
	require.Empty(t, other.header.Get("Idempotency-Replayed"))
	require.Equal(t, 0, tg.effects(t, "refund 2 "))

	q1 := tg.post(t, "/orders/3/refund?amount=100&currency=eur", "q", "acme", `{}`)
	require.Equal(t, http.StatusCreated, q1.status)
	q2 := tg.post(t, "/orders/3/refund?amount=999999&currency=eur", "q", "acme", `{}`)
	require.Equal(t, http.StatusUnprocessableEntity, q2.status)
	require.Equal(t, 0, tg.effects(t, "refund 3 999999"))
	// The same parameters in another order are the same request.
	q3 := tg.post(t, "/orders/3/refund?currency=eur&amount=100", "q", "acme", `{}`)
	require.Equal(t, http.StatusCreated, q3.status)
	require.Equal(t, "true", q3.header.Get("Idempotency-Replayed"))
	require.Equal(t, 1, tg.effects(t, "refund 3 100"))
}

// What reaches the client is what committed: a redirect after a write is stored and
// replayed with its Location, 1xx responses are not final, and an unstored
// success-looking status is turned into a problem because its writes were rolled back.
func TestMiddleware_AnswerMatchesCommit(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, func(c *idempotency.Config) {
		c.StoreFunc = func(status int) bool { return status != http.StatusOK && idempotency.StoreDefault(status) }
	}, false)

	prg := tg.post(t, "/prg", "p", "acme", `{}`)
	require.Equal(t, http.StatusSeeOther, prg.status)
	require.Equal(t, "/orders/7", prg.header.Get("Location"))
	require.Equal(t, 1, tg.effects(t, "prg"), "the write behind the 303 committed")
	again := tg.post(t, "/prg", "p", "acme", `{}`)
	require.Equal(t, http.StatusSeeOther, again.status)
	require.Equal(t, "/orders/7", again.header.Get("Location"))
	require.Equal(t, "true", again.header.Get("Idempotency-Replayed"))
	require.Equal(t, 1, tg.effects(t, "prg"))

	hints := tg.post(t, "/hints", "h", "acme", `{}`)
	require.Equal(t, http.StatusCreated, hints.status)
	require.Equal(t, "created", string(hints.body))
	require.Equal(t, 1, tg.effects(t, "hints"), "the write behind the 201 committed")
	hints = tg.post(t, "/hints", "h", "acme", `{}`)
	require.Equal(t, http.StatusCreated, hints.status)
	require.Equal(t, "true", hints.header.Get("Idempotency-Replayed"))

	ok := tg.post(t, "/ok", "o", "acme", `{}`)
	require.Equal(t, http.StatusInternalServerError, ok.status, "a rolled-back 200 must not reach the client")
	require.Equal(t, idempotency.ProblemNotStored, problemType(t, ok))
	require.Equal(t, 0, tg.effects(t, "ok"))
}

// A hostile, deeply nested JSON body is refused with a problem, cheaply.
func TestMiddleware_DeepJSON(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, func(c *idempotency.Config) { c.MaxBodyBytes = 4 << 20 }, false)
	r := tg.post(t, "/orders", "deep", "acme", strings.Repeat("[", 4<<20))
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, idempotency.ProblemBodyTooDeep, problemType(t, r))
	require.Less(t, len(r.body), 1000, "the problem does not echo the body")
	require.Equal(t, 0, tg.effects(t, "order"))
}

// The representation headers are replayed, so a compressed answer stays readable;
// Set-Cookie never is, even when configured.
func TestMiddleware_ReplayedHeaders(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, func(c *idempotency.Config) {
		c.ReplayHeaders = append(idempotency.ReplayHeadersDefault(), "Set-Cookie")
	}, false)
	first := tg.post(t, "/gzip", "z", "acme", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	replay := tg.post(t, "/gzip", "z", "acme", `{}`)
	require.Equal(t, "true", replay.header.Get("Idempotency-Replayed"))
	require.Equal(t, "gzip", replay.header.Get("Content-Encoding"))
	require.Equal(t, first.body, replay.body)
	zr, err := gzip.NewReader(bytes.NewReader(replay.body))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.JSONEq(t, `{"compressed":true}`, string(plain))
	require.Empty(t, replay.header.Values("Set-Cookie"))
}

// Scope parts the server derives are never refused: a long or non-ASCII path or tenant
// works, and so does a long or non-ASCII route from a RouteFunc (here the path itself,
// to derive one from anything); only the key itself can be blamed.
func TestMiddleware_DerivedScopeAlwaysAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		configure func(*idempotency.Config)
	}{
		{"RoutePattern", nil},
		{"RouteFunc", func(c *idempotency.Config) { c.RouteFunc = func(r *http.Request) string { return r.URL.Path } }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tg := setupTargets(t, tc.configure, true)
			for i, c := range []struct{ target, client string }{
				{"/" + strings.Repeat("p", 151), "acme"},
				{"/caf%C3%A9/%E2%82%AC", "acme"},
				{"/orders", "jürgen@müller.example"},
				{"/orders", strings.Repeat("t", 137)},
			} {
				key := fmt.Sprintf("key-%d", i)
				r := tg.post(t, c.target, key, c.client, `{}`)
				require.Equal(t, http.StatusCreated, r.status, "%s as %s: %s", c.target, c.client, r.body)
				r = tg.post(t, c.target, key, c.client, `{}`)
				require.Equal(t, "true", r.header.Get("Idempotency-Replayed"), "%s as %s", c.target, c.client)
			}
			r := tg.post(t, "/orders", strings.Repeat("k", 300), "acme", `{}`)
			require.Equal(t, http.StatusBadRequest, r.status)
			require.Equal(t, idempotency.ProblemKeyInvalid, problemType(t, r))
		})
	}
}

// The operation is "METHOD pattern", said once, so a per-route retention applies.
func TestMiddleware_OperationNameAndRetention(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, nil, false)
	require.Equal(t, http.StatusCreated, tg.post(t, "/orders", "ret", "acme", `{}`).status)
	var op string
	var kept time.Duration
	require.NoError(t, tg.pool.QueryRow(context.Background(),
		`SELECT operation, expires_at - created_at FROM `+pgx.Identifier{tg.schema, "idempotency_records"}.Sanitize()+` WHERE key = 'ret'`).
		Scan(&op, &kept))
	require.Equal(t, "POST /orders", op)
	require.Equal(t, 2*time.Hour, kept, "OperationRetention[\"POST /orders\"] took effect")
	req := httptest.NewRequest(http.MethodPost, "/orders/1/refund", nil)
	require.Equal(t, "POST /orders/{id}/refund", idempotency.Operation(req, "POST /orders/{id}/refund"))
	require.Equal(t, "POST /orders/{id}/refund", idempotency.Operation(req, "/orders/{id}/refund"))
}

// A method the client makes up must not make an operation of its own: each would be a
// metric series and a scope.
func TestMiddleware_MadeUpMethodsShareOneOperation(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for i := range 20 {
		req := httptest.NewRequest(fmt.Sprintf("X%dMETHOD", i), "/items/1", nil)
		seen[idempotency.Operation(req, "/items/{id}")] = true
	}
	require.Equal(t, map[string]bool{idempotency.MethodOther + " /items/{id}": true}, seen)
	req := httptest.NewRequest(http.MethodPatch, "/items/1", nil)
	require.Equal(t, "PATCH /items/{id}", idempotency.Operation(req, "/items/{id}"))
}

// A guarded handler writes to a buffer that reaches the client only after the commit,
// so it cannot stream: Flush and Hijack are not supported, as the package says.
func TestMiddleware_GuardedHandlerCannotStream(t *testing.T) {
	t.Parallel()
	var flushErr, hijackErr error
	var isFlusher bool
	tg := setupTargets(t, nil, false)
	mw, err := idempotency.New(&idempotency.Config{Ledger: tg.ledger, TenantFunc: idempotency.FixedTenant("acme")})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, isFlusher = w.(http.Flusher)
		rc := http.NewResponseController(w)
		flushErr = rc.Flush()
		_, _, hijackErr = rc.Hijack()
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "s")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.False(t, isFlusher)
	require.ErrorIs(t, flushErr, http.ErrNotSupported)
	require.ErrorIs(t, hijackErr, http.ErrNotSupported)
}

// Config.Methods says which methods must carry a key; a safe method is never guarded,
// so listing one is refused rather than silently ignored. Negative limits are refused.
func TestNew_RefusesSafeMethodsAndNegativeLimits(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, nil, false)
	for _, cfg := range []idempotency.Config{
		{Methods: []string{http.MethodPost, http.MethodGet}},
		{Methods: []string{http.MethodHead}},
		{MaxResponseBytes: -1},
		{MaxBodyBytes: -1},
	} {
		cfg.Ledger, cfg.TenantFunc = tg.ledger, idempotency.FixedTenant("acme")
		_, err := idempotency.New(&cfg)
		require.Error(t, err, "%+v", cfg.Methods)
	}
	_, err := idempotency.New(&idempotency.Config{Ledger: tg.ledger, TenantFunc: idempotency.FixedTenant("acme"),
		Methods: []string{http.MethodPost, http.MethodPut, http.MethodDelete}})
	require.NoError(t, err)
}

// A response that declares its length is buffered in one allocation of that size, and
// a declared length past the limit is not believed: the buffer stops at the limit.
func TestMiddleware_DeclaredResponseLength(t *testing.T) {
	t.Parallel()
	tg := setupTargets(t, nil, false)
	mw, err := idempotency.New(&idempotency.Config{Ledger: tg.ledger, TenantFunc: idempotency.FixedTenant("acme"), MaxResponseBytes: 4096})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", r.URL.Query().Get("declare"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(r.URL.Query().Get("body")))
	})))
	defer srv.Close()
	post := func(query, key string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/x?"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusCreated, post("declare=5&body=hello", "a"))
	require.Equal(t, http.StatusCreated, post("declare=9223372036854775807&body=hello", "b"))
	require.Equal(t, http.StatusInternalServerError, post("declare=5000&body="+strings.Repeat("x", 5000), "c"))
}

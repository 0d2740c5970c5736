package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

// Tokens of the console's users in the tests.
const (
	testOperatorToken = "operator-token-0123456789abcdef"
	testViewerToken   = "viewer-token-0123456789abcdef"
)

// syncBuffer is the console's log, written by its handlers and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// uiServer is a console serving the bundle's schema, started as oncekit ui starts it.
type uiServer struct {
	url string
	log *syncBuffer
}

// startUI runs oncekit ui's code on a free loopback port with the operator's and the
// viewer's tokens, and stops it when the test ends.
func startUI(t *testing.T, b *bundle, f uiFlags) *uiServer {
	t.Helper()
	return startUIWith(t, b.schema, map[string]string{"DATABASE_URL": pgtest.URL(t)}, f)
}

// startUIWith is startUI on schema with the environment env.
func startUIWith(t *testing.T, schema string, env map[string]string, f uiFlags) *uiServer {
	t.Helper()
	if !f.insecureLocal {
		env["ONCEKIT_UI_TOKEN"], env["ONCEKIT_UI_VIEWER_TOKEN"] = testOperatorToken, testViewerToken
	}
	logs := &syncBuffer{}
	a := &app{ctx: context.Background(), out: io.Discard, errOut: logs, getenv: func(k string) string { return env[k] }, schema: schema}
	if f.listen == "" {
		f.listen = "127.0.0.1:0"
	}
	if f.temporalNS == "" {
		f.temporalNS = "default"
	}
	f.shutdownTimeout = time.Second
	ready := make(chan string, 1)
	stop := make(chan struct{})
	f.ready = func(addr string) { ready <- addr }
	f.stop = stop
	done := make(chan error, 1)
	go func() { done <- a.ui(&f) }()
	select {
	case addr := <-ready:
		t.Cleanup(func() {
			close(stop)
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Error("the console did not stop")
			}
		})
		return &uiServer{url: "http://" + addr, log: logs}
	case err := <-done:
		t.Fatalf("the console did not start: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the console did not start in 30 s")
	}
	return nil
}

// uiClient is a browser-like client: it keeps cookies and sends a token.
type uiClient struct {
	t     *testing.T
	base  string
	token string
	http  *http.Client
}

func (s *uiServer) client(t *testing.T, token string) *uiClient {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &uiClient{t: t, base: s.url, token: token, http: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *uiClient) do(method, path string, form url.Values) (int, http.Header, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, resp.Header, string(b)
}

func (c *uiClient) get(path string) (int, string) {
	c.t.Helper()
	code, _, body := c.do(http.MethodGet, path, nil)
	return code, body
}

// post posts form as the page at page would: with the CSRF token of the browser's cookie,
// which the page's GET set.
func (c *uiClient) post(page, path string, form url.Values) (int, string) {
	c.t.Helper()
	code, body := c.get(page)
	require.Equal(c.t, http.StatusOK, code, body)
	u, err := url.Parse(c.base)
	require.NoError(c.t, err)
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == csrfCookie {
			form.Set("csrf", ck.Value)
		}
	}
	require.NotEmpty(c.t, form.Get("csrf"), "no CSRF cookie")
	code, _, body = c.do(http.MethodPost, path, form)
	return code, body
}

func q(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

// The console refuses to start without authentication, and serves without it only on a
// loopback address with --insecure-local.
func TestUI_RefusesToStartWithoutAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "ui")
	require.Equal(t, exitUsage, r.code, r.errOut)
	require.Contains(t, r.errOut, "ONCEKIT_UI_TOKEN")
	r = b.run(t, "ui", "--insecure-local", "--listen", "0.0.0.0:0")
	require.Equal(t, exitUsage, r.code, r.errOut)
	require.Contains(t, r.errOut, "loopback")
	r = oncekit(t, append(b.env, "ONCEKIT_UI_TOKEN=short"), "ui", "--schema", b.schema)
	require.Equal(t, exitUsage, r.code, r.errOut)
	require.Contains(t, r.errOut, "16 characters")
	require.NotContains(t, r.errOut, "short", "no secret in messages")

	s := startUI(t, b, uiFlags{insecureLocal: true})
	code, body := s.client(t, "").get("/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "local · operator")
	// DNS rebinding: another name for 127.0.0.1 is refused when there is no authentication.
	req, err := http.NewRequest(http.MethodGet, s.url+"/", nil)
	require.NoError(t, err)
	req.Host = "attacker.example:8080"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}

// Every request needs a user; every response has the strict security headers; a viewer
// neither acts nor reveals; every POST needs the CSRF token of the browser's cookie;
// read-only refuses every action; no secret or body reaches the log.
func TestUI_Security(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{"card":"4242-secret-body"}`)
	b.stuck(t, "acme", "payments.charge", "s-1")
	s := startUI(t, b, uiFlags{})

	for _, c := range []*uiClient{s.client(t, ""), s.client(t, "wrong-token-0123456789abcdef")} {
		code, hdr, body := c.do(http.MethodGet, "/", nil)
		require.Equal(t, http.StatusUnauthorized, code)
		require.Contains(t, hdr.Get("WWW-Authenticate"), "Basic")
		require.NotContains(t, body, "acme")
		code, _, _ = c.do(http.MethodPost, "/change", url.Values{"action": {"release"}})
		require.Equal(t, http.StatusUnauthorized, code)
	}
	// Basic auth names the user; a right secret under another name is refused.
	req, _ := http.NewRequest(http.MethodGet, s.url+"/", nil)
	req.SetBasicAuth("viewer", testViewerToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	req.SetBasicAuth("operator", testViewerToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	viewer, operator := s.client(t, testViewerToken), s.client(t, testOperatorToken)
	code, hdr, body := viewer.do(http.MethodGet, "/", nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, contentSecurityPolicy, hdr.Get("Content-Security-Policy"))
	require.Contains(t, hdr.Get("Content-Security-Policy"), "default-src 'self'")
	require.NotContains(t, hdr.Get("Content-Security-Policy"), "unsafe-inline")
	require.Equal(t, "DENY", hdr.Get("X-Frame-Options"))
	require.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"))
	require.NotContains(t, body, "<script", "no script, inline or not")
	require.NotContains(t, body, " style=", "no inline style")
	require.Contains(t, body, "s-1", "the stuck panel")
	require.NotContains(t, body, "Release stuck records", "a viewer is offered no action")

	record := "/record?" + q("tenant", "acme", "operation", "orders.create", "key", "o-1")
	code, body = viewer.get(record)
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "4242-secret-body", "the body is redacted")
	require.Contains(t, body, "redacted")
	require.NotContains(t, body, `id="reveal"`)
	// A viewer's forms (none offered) are refused even with a valid token.
	code, _ = viewer.post("/records", "/record/reveal", url.Values{"tenant": {"acme"}, "operation": {"orders.create"}, "key": {"o-1"}})
	require.Equal(t, http.StatusForbidden, code)
	code, _ = viewer.post("/records", "/change", url.Values{"action": {"release"}, "target": {"one"}, "tenant": {"acme"},
		"operation": {"payments.charge"}, "key": {"s-1"}, "reason": {"x"}})
	require.Equal(t, http.StatusForbidden, code)

	// An operator reveals, with the CSRF token.
	code, body = operator.post(record, "/record/reveal", url.Values{"tenant": {"acme"}, "operation": {"orders.create"}, "key": {"o-1"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "4242-secret-body")

	// A forged POST: no token, or a token not the cookie's.
	release := url.Values{"action": {"release"}, "target": {"one"}, "tenant": {"acme"}, "operation": {"payments.charge"},
		"key": {"s-1"}, "reason": {"forged"}}
	code, _, body = operator.do(http.MethodPost, "/change", release)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "CSRF")
	forged := url.Values{}
	for k, v := range release {
		forged[k] = v
	}
	forged.Set("csrf", strings.Repeat("ab", 32))
	code, _, _ = operator.do(http.MethodPost, "/change", forged)
	require.Equal(t, http.StatusForbidden, code)
	_, err = b.ledger.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: "payments.charge"}, "s-1")
	require.NoError(t, err, "no forged request changed anything")

	logs := s.log.String()
	require.Contains(t, logs, "POST /change 403")
	for _, secret := range []string{testOperatorToken, testViewerToken, "4242-secret-body", "forged"} {
		require.NotContains(t, logs, secret)
	}
}

// --read-only refuses every action, to an operator too, and offers none.
func TestUI_ReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stuck(t, "acme", "payments.charge", "s-1")
	b.complete(t, "acme", "orders.create", "o-1", `{"ok":true}`)
	s := startUI(t, b, uiFlags{readOnly: true})
	op := s.client(t, testOperatorToken)
	preview := "/change?" + q("action", "release", "target", "one", "tenant", "acme", "operation", "payments.charge", "key", "s-1")
	code, body := op.get(preview)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "read-only")
	require.NotContains(t, body, `id="confirm"`)
	// The record page offers reveal (no change) but no action.
	code, body = op.get("/record?" + q("tenant", "acme", "operation", "orders.create", "key", "o-1"))
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, `id="action"`)
	for _, path := range []string{"/change", "/outbox/retry", "/purge"} {
		code, body = op.post("/record?"+q("tenant", "acme", "operation", "orders.create", "key", "o-1"), path,
			url.Values{"action": {"release"}, "target": {"one"}, "tenant": {"acme"}, "operation": {"payments.charge"}, "key": {"s-1"},
				"reason": {"INC-1"}, "all": {"1"}})
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "read-only")
	}
	_, err := b.ledger.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: "payments.charge"}, "s-1")
	require.NoError(t, err)
}

// A release is previewed, refused without a reason, and made with one, keeping an audit
// row naming the console's user; a live lease is refused without force.
func TestUI_ReleaseWithReasonAndLiveLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stuck(t, "acme", "payments.charge", "s-1")
	b.claim(t, "acme", "payments.charge", "live", time.Hour)
	s := startUI(t, b, uiFlags{})
	op := s.client(t, testOperatorToken)
	ctx := context.Background()
	scope := keys.Scope{Tenant: "acme", Operation: "payments.charge"}

	one := func(key string, extra ...string) url.Values {
		v := url.Values{"action": {"release"}, "target": {"one"}, "tenant": {"acme"}, "operation": {"payments.charge"}, "key": {key}}
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}
	preview := "/change?" + one("s-1").Encode()
	code, body := op.get(preview)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "this will release")
	require.Contains(t, body, "1 record")

	code, body = op.post(preview, "/change", one("s-1"))
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "needs a reason")
	_, err := b.ledger.Get(ctx, scope, "s-1")
	require.NoError(t, err, "no reason, no release")

	code, body = op.post(preview, "/change", one("s-1", "reason", "INC-7: worker host lost"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 released")
	_, err = b.ledger.Get(ctx, scope, "s-1")
	require.ErrorIs(t, err, ledger.ErrNotFound)
	entries, err := b.ledger.Audit(ctx, scope, "s-1")
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "operator (oncekit ui)", entries[0].Actor)
	require.Equal(t, "INC-7: worker host lost", entries[0].Reason)
	code, body = op.get("/record?" + q("tenant", "acme", "operation", "payments.charge", "key", "s-1"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "INC-7: worker host lost", "the record's page shows its audit history")

	// A live lease: refused without force, whatever the form says.
	livePreview := "/change?" + one("live").Encode()
	code, body = op.get(livePreview)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "lease is live")
	require.NotContains(t, body, `id="confirm"`)
	code, body = op.post(livePreview, "/change", one("live", "reason", "INC-8"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "0 released")
	_, err = b.ledger.Get(ctx, scope, "live")
	require.NoError(t, err, "the live lease stays")
	code, body = op.post(livePreview, "/change", one("live", "reason", "INC-8: owner gone", "force", "1"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 released")
	entries, err = b.ledger.Audit(ctx, scope, "live")
	require.NoError(t, err)
	require.True(t, entries[0].Forced)
}

// Search by filters pages with list's cursor; a bulk release by filter counts first;
// a key holding markup is shown as text.
func TestUI_SearchPagingBulkAndEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"k-1", "k-2", "k-3"} {
		b.stuck(t, "acme", "payments.charge", k)
	}
	b.complete(t, "acme", "orders.create", `<script>alert("x")</script>`, `{}`)
	s := startUI(t, b, uiFlags{})
	op := s.client(t, testOperatorToken)

	code, body := op.get("/records?" + q("tenant", "acme", "operation", "payments.charge", "limit", "2"))
	require.Equal(t, http.StatusOK, code, body)
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, next, body)
	seen := strings.Count(body, "payments.charge</td>")
	require.Equal(t, 2, seen)
	code, body2 := op.get(strings.ReplaceAll(next[1], "&amp;", "&"))
	require.Equal(t, http.StatusOK, code, body2)
	require.Equal(t, 1, strings.Count(body2, "payments.charge</td>"))
	require.NotContains(t, body2, `id="next"`)

	code, body = op.get("/change?" + q("action", "release", "tenant", "acme", "stuck", "1"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "3 records")
	recs, err := b.ledger.List(context.Background(), &ledger.ListOpts{State: ledger.StatePending})
	require.NoError(t, err)
	require.Len(t, recs, 3, "a preview changes nothing")

	// An uncertain outcome is in its panel.
	lease := b.claim(t, "acme", "payments.charge", "maybe-charged", time.Hour)
	require.NoError(t, b.ledger.MarkUncertain(context.Background(), lease))
	code, body = op.get("/")
	require.Equal(t, http.StatusOK, code, body)
	panel := body[strings.Index(body, `id="panel-uncertain"`):strings.Index(body, `id="panel-outbox"`)]
	require.Contains(t, panel, "maybe-charged")
	require.NotContains(t, panel, "k-1")

	code, body = op.get("/records?" + q("key", `<script>alert("x")</script>`))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	require.NotContains(t, body, "<script>")
}

// Outbox retry and purge are previewed, need a reason, and a retry keeps its audit rows.
func TestUI_OutboxRetryAndPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, ids := b.deadEvents(t, "payments.captured")
	s := startUI(t, b, uiFlags{})
	op := s.client(t, testOperatorToken)

	code, body := op.get("/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, ids[0].String(), "the dead events panel")
	require.Contains(t, body, "payments.captured", "the backlog by topic")
	preview := "/outbox/retry?" + q("topic", "payments.captured")
	code, body = op.get(preview)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 dead event")
	code, _ = op.post(preview, "/outbox/retry", url.Values{"topic": {"payments.captured"}})
	require.Equal(t, http.StatusBadRequest, code)
	code, body = op.post(preview, "/outbox/retry", url.Values{"topic": {"payments.captured"}, "reason": {"INC-313"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Retried 1 event")
	e, err := out.Get(context.Background(), ids[0])
	require.NoError(t, err)
	require.Equal(t, outbox.StatePending, e.State)
	entries, err := out.ListAudit(context.Background(), &outbox.AuditOpts{EventID: ids[0]})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "operator (oncekit ui)", entries[0].Actor)
	require.Equal(t, "INC-313", entries[0].Reason)

	code, body = op.get("/purge")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Would delete")
	require.Contains(t, body, b.schema+".idempotency_records")
	code, body = op.post("/purge", "/purge", url.Values{"reason": {"INC-400: disk"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Purged 0 rows")
	require.Contains(t, s.log.String(), `purge: user=operator deleted=0 reason="INC-400: disk"`)

	// An eviction: the wrong state is refused, the right one evicted with its audit row.
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.claim(t, "acme", "orders.create", "o-pending", time.Hour)
	evict := func(key string) url.Values {
		return url.Values{"action": {"evict"}, "target": {"one"}, "tenant": {"acme"}, "operation": {"orders.create"}, "key": {key}}
	}
	code, body = op.get("/change?" + evict("o-pending").Encode())
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, body, "release")
	preview = "/change?" + evict("o-1").Encode()
	form := evict("o-1")
	form.Set("reason", "INC-401: wrong price stored")
	code, body = op.post(preview, "/change", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 evicted")
	audit, err := b.ledger.Audit(context.Background(), keys.Scope{Tenant: "acme", Operation: "orders.create"}, "o-1")
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, ledger.ActionEvict, audit[0].Action)
}

// oncekit ui as a process: it says where it serves, answers the token it is given, and
// ends with exit 0 on SIGTERM.
func TestUI_CommandServesAndStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cmd := exec.Command(os.Args[0], "ui", "--listen", "127.0.0.1:0", "--schema", b.schema)
	cmd.Env = append(append(os.Environ(), "ONCEKIT_TEST_RUN_COMMAND=1", "ONCEKIT_UI_TOKEN="+testOperatorToken), b.env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stderr)
	require.True(t, lines.Scan(), "no line on stderr")
	addr := regexp.MustCompile(`serving (http://127\.0\.0\.1:\d+) \(1 users`).FindStringSubmatch(lines.Text())
	require.NotNil(t, addr, lines.Text())
	go func() {
		for lines.Scan() { // the request log
		}
	}()
	c := (&uiServer{url: addr[1]}).client(t, testOperatorToken)
	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Stuck pending claims")
	code, _ = (&uiServer{url: addr[1]}).client(t, "").get("/")
	require.Equal(t, http.StatusUnauthorized, code)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit 0 on SIGTERM")
}

// With shards, the console reads one at a time, chosen by the shard selector, and says
// so when a shard is not one of them.
func TestUI_ShardSelector(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("shards are independent PostgreSQL clusters")
	}
	ctx := context.Background()
	pools, schema, clusters := pgtest.Shards(t, 2)
	for i, p := range pools {
		_, err := migrate.Up(ctx, p, schema)
		require.NoError(t, err)
		l, err := ledger.New(p, &ledger.Config{Schema: schema})
		require.NoError(t, err)
		_, err = l.Do(ctx, intent(t, "acme", "orders.create", fmt.Sprintf("on-shard-%d", i)), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Code: 201}, nil
		}, nil)
		require.NoError(t, err)
	}
	s := startUIWith(t, schema, map[string]string{"ONCEKIT_SHARDS": "a=" + pgtest.URL(t) + ";b=" + clusters[0].ConnString()}, uiFlags{})
	op := s.client(t, testOperatorToken)
	code, body := op.get("/records?" + q("tenant", "acme"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<option value="b">b</option>`, "the selector")
	require.Contains(t, body, "on-shard-0")
	require.NotContains(t, body, "on-shard-1")
	code, body = op.get("/records?" + q("tenant", "acme", "shard", "b"))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "on-shard-1")
	require.NotContains(t, body, "on-shard-0")
	require.Contains(t, body, `/record?key=on-shard-1&amp;operation=orders.create&amp;shard=b&amp;tenant=acme`, "links keep the shard")
	code, _ = op.get("/?shard=c")
	require.Equal(t, http.StatusNotFound, code)
}

// The auth file names users and their roles; a line that does not parse is refused
// without echoing it, as is a short secret; basic auth needs the name and the secret
// together.
func TestUI_AuthFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, fmt.Sprintf("users-%d", len(text)))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	none := func(string) string { return "" }
	users, err := uiUsers(write("# on-call\noperator alice alice-secret-0123456789\n\nviewer bob bob-secret-0123456789\n"), none)
	require.NoError(t, err)
	require.Len(t, users, 2)
	require.Equal(t, roleOperator, users[0].Role)
	require.Equal(t, roleViewer, users[1].Role)

	_, err = uiUsers(write("admin carol carol-secret-0123456789\n"), none)
	require.ErrorContains(t, err, "line 1")
	require.NotContains(t, err.Error(), "carol-secret")
	_, err = uiUsers(write("operator dave short\n"), none)
	require.ErrorContains(t, err, "16 characters")
	_, err = uiUsers(write("operator erin erin-secret-0123456789\nviewer erin erin-secret-9876543210\n"), none)
	require.ErrorContains(t, err, "twice")

	c := &console{users: users}
	req := func(name, secret string) (uiUser, bool) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.SetBasicAuth(name, secret)
		return c.authenticate(r)
	}
	u, ok := req("alice", "alice-secret-0123456789")
	require.True(t, ok)
	require.Equal(t, "alice", u.Name)
	require.Equal(t, "alice (oncekit ui)", actorOf(u))
	_, ok = req("bob", "alice-secret-0123456789")
	require.False(t, ok, "a secret under another name")
	_, ok = req("alice", "")
	require.False(t, ok)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer bob-secret-0123456789")
	u, ok = c.authenticate(r)
	require.True(t, ok)
	require.Equal(t, roleViewer, u.Role)
}

package main

import (
	"context"
	"fmt"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// The console in a real browser: Debian's Chromium, headless, driven by chromedp, against
// a real PostgreSQL. With ONCEKIT_UI_SCREENSHOTS=1 the test also writes the screenshots of
// docs/operating.md (docs/images/console-*.png).

// chromiumPath is the browser the tests drive: ONCEKIT_CHROMIUM, else Debian's. Under
// -short (make test-pg, which runs the command's tests again on each other PostgreSQL
// major) the browser tests skip: what the browser does is the same on every major, and
// the console's queries run in the other UI tests.
func chromiumPath(t *testing.T) string {
	if testing.Short() {
		t.Skip("the console in a browser: make test runs it; -short skips it")
	}
	path := os.Getenv("ONCEKIT_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the console's browser tests need Chromium at %s: install it with `apt-get install chromium` (CI does), or name another with ONCEKIT_CHROMIUM (%v)", path, err)
	}
	return path
}

// newBrowser starts a headless Chromium of its own profile and returns its context; the
// browser ends with the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // as root
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "Chromium did not start")
	return ctx
}

// tab opens a tab of the browser that sends token, if any, with every request.
func tab(t *testing.T, browser context.Context, token string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900), func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		if token == "" {
			return chromedp.Void{}, nil
		}
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return chromedp.Void{}, err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
			Headers: network.Headers{"Authorization": "Bearer " + token}})
		return chromedp.Void{}, err
	}))
	return ctx
}

// step runs actions on the tab within 20 s.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, actions...), what)
}

// text reads the visible text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Text(sel))
	require.NoError(t, err, sel)
	return s
}

// searched waits until the tab shows the results of a search whose query holds param:
// the page before the search may show a table of records too.
func searched(t *testing.T, ctx context.Context, param string) {
	arrived(t, ctx, param, "table.records")
}

// arrived waits until the tab shows a page whose query holds param and that has sel,
// for a click that leaves a page that has sel too.
func arrived(t *testing.T, ctx context.Context, param, sel string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		_, err := chromedp.Run(sctx, chromedp.Poll[bool](fmt.Sprintf("location.search.includes(%q) && document.readyState === 'complete' && document.querySelector(%q) !== null", param, sel)))
		if err != nil && sctx.Err() == nil {
			continue // the poll began on the page the search left, which went away under it
		}
		require.NoError(t, err, "the search for %s", param)
		return
	}
}

// screenshot writes the page as docs/images/console-NAME.png when ONCEKIT_UI_SCREENSHOTS=1.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("ONCEKIT_UI_SCREENSHOTS") != "1" {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("..", "..", "docs", "images", "console-"+name+".png"), png, 0o644))
}

func TestUI_Browser(t *testing.T) {
	chromiumPath(t) // before anything else: without Chromium, say so at once
	b := setup(t)
	ctx := context.Background()
	b.complete(t, "shop", "orders.create", "order-17", `{"order":17,"card":"4242 4242 4242 4242"}`)
	b.complete(t, "shop", "orders.create", `<script>alert("x")</script>`, `{}`)
	runKey := string(keys.Run("0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44", "5"))
	b.stuck(t, "shop", "payments.charge", runKey)
	b.stuck(t, "shop", "payments.charge", string(keys.Run("0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44", "9")))
	liveKey := string(keys.Run("0196f3c3-1111-7a1b-9c55-2f0e8b6d1a44", "5"))
	b.claim(t, "shop", "payments.charge", liveKey, time.Hour)
	b.deadEvents(t, "payments.captured")
	// Workflow order-1 charged in two runs, under default keys, which hold run IDs only.
	chargeKeys := map[string]string{}
	for _, run := range []string{"0196f3c4-aaaa-7a1b-9c55-2f0e8b6d1a44", "0196f3c4-bbbb-7a1b-9c55-2f0e8b6d1a44"} {
		k := string(keys.Run(run, "5"))
		chargeKeys[run] = k
		octx := ledger.WithOrigin(ctx, ledger.Origin{WorkflowID: "order-1", RunID: run, WorkflowType: "Order", ActivityType: "payments.Charge"})
		_, err := b.ledger.Do(octx, intent(t, "shop", "payments.Charge", k), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Body: []byte(`{"charge":"ch_1"}`)}, nil
		}, nil)
		require.NoError(t, err)
	}

	s := startUI(t, b, uiFlags{temporalUI: "http://localhost:8233"})
	browser := newBrowser(t)
	op := tab(t, browser, testOperatorToken)

	// The overview's panels.
	step(t, op, "overview", chromedp.Navigate(s.url+"/"), chromedp.WaitVisible("#panel-stuck"))
	require.Contains(t, text(t, op, "#panel-stuck"), runKey)
	require.Contains(t, text(t, op, "#panel-outbox"), "payments.captured")
	screenshot(t, op, "home")

	// Search by tenant and operation, through the form.
	step(t, op, "search",
		chromedp.Navigate(s.url+"/records"),
		chromedp.SetValue(`#search input[name="tenant"]`, "shop"),
		chromedp.SetValue(`#search input[name="operation"]`, "orders.create"),
		chromedp.Click("#search-button"))
	searched(t, op, "operation=orders.create")
	results := text(t, op, "table.records")
	require.Contains(t, results, "order-17")
	require.NotContains(t, results, "payments.charge")
	// A key holding markup is text: no script element on the page, and no dialog.
	require.Contains(t, results, `<script>alert("x")</script>`)
	sctx, cancel := context.WithTimeout(op, 20*time.Second)
	scripts, err := chromedp.Run(sctx, chromedp.Evaluate[int]("document.querySelectorAll('script').length"))
	cancel()
	require.NoError(t, err)
	require.Zero(t, scripts)
	screenshot(t, op, "search")

	// The record page: the body redacted until revealed.
	step(t, op, "record", chromedp.Click(`a.key[href*="order-17"]`), chromedp.WaitVisible("#state"))
	require.Contains(t, text(t, op, "#state"), "completed")
	require.Contains(t, text(t, op, "#body"), "redacted")
	require.NotContains(t, text(t, op, "main"), "4242 4242")
	step(t, op, "reveal", chromedp.Click("#reveal"), chromedp.WaitVisible("#body-text"))
	require.Contains(t, text(t, op, "#body-text"), "4242 4242")

	// "Workflow order-1 charged twice?": a search by its workflow ID alone finds both runs'
	// charges, and each record names the run that made it, linked to Temporal's Web UI.
	step(t, op, "search by workflow ID",
		chromedp.Navigate(s.url+"/records"),
		chromedp.SetValue(`#search input[name="workflow_id"]`, "order-1"),
		chromedp.SetValue(`#search input[name="activity_type"]`, "payments.Charge"),
		chromedp.Click("#search-button"))
	searched(t, op, "workflow_id=order-1")
	results = text(t, op, "table.records")
	for _, k := range chargeKeys {
		require.Contains(t, results, k)
	}
	require.NotContains(t, results, runKey)
	require.Contains(t, results, "order-1")
	sctx, cancel = context.WithTimeout(op, 20*time.Second)
	n, err := chromedp.Run(sctx, chromedp.Evaluate[int]("document.querySelectorAll('table.records tbody tr').length"))
	cancel()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	screenshot(t, op, "search-workflow")
	run := "0196f3c4-bbbb-7a1b-9c55-2f0e8b6d1a44"
	step(t, op, "charge record", chromedp.Click(`a.key[href*="bbbb"]`), chromedp.WaitVisible("#workflow"))
	require.Contains(t, text(t, op, "#workflow"), "order-1")
	require.Contains(t, text(t, op, "#run"), run)
	require.Equal(t, "payments.Charge", text(t, op, "#activity-type"))
	sctx, cancel = context.WithTimeout(op, 20*time.Second)
	href, err := chromedp.Run(sctx, chromedp.Evaluate[string]("document.querySelector('#temporal').href"))
	cancel()
	require.NoError(t, err)
	require.Equal(t, "http://localhost:8233/namespaces/default/workflows/order-1/"+run+"/history", href)

	// A pending record: lease, downstream key, a link to Temporal's Web UI.
	step(t, op, "stuck record", chromedp.Navigate(s.url+"/record?"+q("tenant", "shop", "operation", "payments.charge", "key", runKey)),
		chromedp.WaitVisible("#lease"))
	require.Contains(t, text(t, op, "#lease"), "expired")
	require.NotEmpty(t, text(t, op, "#downstream"))
	sctx, cancel = context.WithTimeout(op, 20*time.Second)
	href, err = chromedp.Run(sctx, chromedp.Evaluate[string]("document.querySelector('#temporal').href"))
	cancel()
	require.NoError(t, err)
	require.Contains(t, href, "http://localhost:8233/namespaces/default/workflows?query=RunId")
	screenshot(t, op, "record")

	// A release with a reason, and its audit row.
	step(t, op, "release preview", chromedp.Click("#action"), chromedp.WaitVisible("#confirm"))
	require.Contains(t, text(t, op, "#summary"), "this will release 1 record")
	screenshot(t, op, "release-preview")
	step(t, op, "release", chromedp.SetValue("#reason", "INC-311: worker host lost"), chromedp.Click("#confirm-button"),
		chromedp.WaitVisible("#done"))
	require.Contains(t, text(t, op, "#audit"), "INC-311: worker host lost")
	require.Contains(t, text(t, op, "#audit"), "operator (oncekit ui)")
	_, err = b.ledger.Get(ctx, keys.Scope{Tenant: "shop", Operation: "payments.charge"}, keys.Key(runKey))
	require.ErrorIs(t, err, ledger.ErrNotFound)
	step(t, op, "audit history", chromedp.Navigate(s.url+"/record?"+q("tenant", "shop", "operation", "payments.charge", "key", runKey)),
		chromedp.WaitVisible("#audit"))
	require.Contains(t, text(t, op, "#audit"), "INC-311: worker host lost")

	// A live lease: the release is refused, with no form to confirm.
	step(t, op, "live lease", chromedp.Navigate(s.url+"/record?"+q("tenant", "shop", "operation", "payments.charge", "key", liveKey)),
		chromedp.WaitVisible("#lease"))
	require.Contains(t, text(t, op, "#lease"), "live")
	step(t, op, "live lease preview", chromedp.Click("#action"), chromedp.WaitVisible("#refused"))
	require.Contains(t, text(t, op, "#refused"), "its lease is live")
	require.Contains(t, text(t, op, "#summary"), "nothing to release")
	step(t, op, "no confirm", chromedp.Query("#confirm", chromedp.NodeNotPresent))
	screenshot(t, op, "refused")

	// A bulk release by filter: the count first.
	step(t, op, "bulk preview", chromedp.Navigate(s.url+"/records?"+q("tenant", "shop", "stuck", "1")),
		chromedp.WaitVisible("#bulk-release"), chromedp.Click("#bulk-release"), chromedp.WaitVisible("#count"))
	require.Equal(t, "1 record", text(t, op, "#count"))
	screenshot(t, op, "bulk-preview")

	// A request without authentication: the console answers 401 with a Basic challenge,
	// which headless Chromium, having no credentials to give, ends as this error.
	anon := tab(t, browser, "")
	sctx, cancel = context.WithTimeout(anon, 20*time.Second)
	_, err = chromedp.Run(sctx, chromedp.NavigateResponse(s.url+"/records"))
	cancel()
	require.ErrorContains(t, err, "ERR_INVALID_AUTH_CREDENTIALS")

	// A forged POST from another page: the browser sends the cookie and the token, but
	// the form lacks the CSRF token.
	forger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%s/change">
<input type="hidden" name="action" value="release"><input type="hidden" name="target" value="one">
<input type="hidden" name="tenant" value="shop"><input type="hidden" name="operation" value="payments.charge">
<input type="hidden" name="key" value="%s"><input type="hidden" name="reason" value="forged"><input type="hidden" name="force" value="1">
</form><script>document.forms[0].submit()</script>`, s.url, liveKey)
	}))
	defer forger.Close()
	step(t, op, "forged POST", chromedp.Navigate(forger.URL), chromedp.WaitVisible("#error"))
	require.Contains(t, text(t, op, "#error"), "CSRF")
	_, err = b.ledger.Get(ctx, keys.Scope{Tenant: "shop", Operation: "payments.charge"}, keys.Key(liveKey))
	require.NoError(t, err, "the forged release changed nothing")

	// Read-only: an operator looks and is offered no action.
	ro := startUI(t, b, uiFlags{readOnly: true})
	step(t, op, "read-only", chromedp.Navigate(ro.url+"/change?"+q("action", "evict", "target", "one", "tenant", "shop",
		"operation", "orders.create", "key", "order-17")), chromedp.WaitVisible("#read-only"))
	require.Contains(t, text(t, op, "main"), "The console is read-only")
	step(t, op, "read-only: no confirm", chromedp.Query("#confirm", chromedp.NodeNotPresent))
	step(t, op, "read-only: no action", chromedp.Navigate(ro.url+"/record?"+q("tenant", "shop", "operation", "orders.create", "key", "order-17")),
		chromedp.WaitVisible("#state"), chromedp.Query("#action", chromedp.NodeNotPresent))
	require.True(t, strings.Contains(text(t, op, "#who"), "read-only"))
}

// A saga's page shows its recorded outcome and links to the records its run wrote (its
// steps and compensations); a step's page links back to the saga.
func TestUI_BrowserSagaAndItsSteps(t *testing.T) {
	chromiumPath(t)
	b := setup(t)
	ctx := context.Background()
	run := "0196f3c5-cccc-7a1b-9c55-2f0e8b6d1a44"
	origin := func(activity string) context.Context {
		return ledger.WithOrigin(ctx, ledger.Origin{WorkflowID: "order-7", RunID: run, WorkflowType: "Order", ActivityType: activity})
	}
	sagaKey, err := keys.Business("saga", "order-7", run)
	require.NoError(t, err)
	claim, err := b.ledger.Claim(origin("oncekit.saga.Begin"), intent(t, "shop", sagaOperation, string(sagaKey)), nil)
	require.NoError(t, err)
	stepKey, err := keys.Derive(sagaKey, "step.charge")
	require.NoError(t, err)
	compKey, err := keys.Derive(stepKey, "compensation")
	require.NoError(t, err)
	for _, st := range []struct {
		op  string
		key keys.Key
	}{{"payments.Charge", stepKey}, {"payments.Refund", compKey}} {
		_, err := b.ledger.Do(origin(st.op), intent(t, "shop", st.op, string(st.key)), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Body: []byte(`{}`)}, nil
		}, nil)
		require.NoError(t, err)
	}
	require.NoError(t, b.ledger.Fail(ctx, claim.Lease, ledger.Definitive("oncekit.saga.Compensated", "the card was declined; refunded")))
	b.complete(t, "shop", "payments.Charge", string(keys.Run("another-run", "1")), `{}`)

	s := startUI(t, b, uiFlags{})
	op := tab(t, newBrowser(t), testOperatorToken)
	step(t, op, "saga", chromedp.Navigate(s.url+"/record?"+q("tenant", "shop", "operation", sagaOperation, "key", string(sagaKey))),
		chromedp.WaitVisible("#saga-outcome"))
	require.Equal(t, "ended with oncekit.saga.Compensated: the card was declined; refunded", text(t, op, "#saga-outcome"))
	panel := text(t, op, "#panel-run")
	require.Contains(t, panel, "steps and compensations")
	require.Contains(t, panel, string(stepKey))
	require.Contains(t, panel, string(compKey))
	require.NotContains(t, panel, "another-run")
	screenshot(t, op, "saga")

	step(t, op, "step", chromedp.Click(`#panel-run a.key[href*="payments.Charge"]`))
	arrived(t, op, "operation=payments.Charge", "#panel-run")
	require.Contains(t, text(t, op, "#key"), string(stepKey))
	step(t, op, "no outcome on a step", chromedp.Query("#saga-outcome", chromedp.NodeNotPresent))
	require.Contains(t, text(t, op, "#panel-run"), string(sagaKey))
	step(t, op, "back to the saga", chromedp.Click(`#panel-run a.key[href*="oncekit.saga"]`), chromedp.WaitVisible("#saga-outcome"))
	require.Contains(t, text(t, op, "#key"), string(sagaKey))
}

// On a large table the overview's counts are reused for --count-cache and shown as
// "about", with the time they were counted; a console that counts every load shows the
// new count. (The table here counts as large from one row.)
func TestUI_BrowserCountsCached(t *testing.T) {
	chromiumPath(t)
	b := setup(t)
	ctx := context.Background()
	b.stuck(t, "shop", "payments.charge", string(keys.Run("run-a", "1")))
	_, err := b.pool.Exec(ctx, "ANALYZE "+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize())
	require.NoError(t, err)

	cached := startUI(t, b, uiFlags{countCache: time.Hour, countCacheRows: 1})
	fresh := startUI(t, b, uiFlags{})
	op := tab(t, newBrowser(t), testOperatorToken)
	step(t, op, "first count", chromedp.Navigate(cached.url+"/"), chromedp.WaitVisible("#counts"))
	require.Equal(t, "1", text(t, op, "#count-stuck"))
	step(t, op, "no age", chromedp.Query("#counts-age", chromedp.NodeNotPresent))

	b.stuck(t, "shop", "payments.charge", string(keys.Run("run-a", "2")))
	step(t, op, "reused count", chromedp.Navigate(cached.url+"/"), chromedp.WaitVisible("#counts-age"))
	require.Equal(t, "about 1", text(t, op, "#count-stuck"))
	require.Contains(t, text(t, op, "#counts-age"), "Records counted at")
	require.Equal(t, "about 0", text(t, op, "#count-uncertain"))

	step(t, op, "counted again", chromedp.Navigate(fresh.url+"/"), chromedp.WaitVisible("#counts"))
	require.Equal(t, "2", text(t, op, "#count-stuck"))
	step(t, op, "fresh: no age", chromedp.Query("#counts-age", chromedp.NodeNotPresent))
}

// chromedp is a dependency of the tests alone: no file of the command imports it, so
// the command's binary does not carry it.
func TestUI_ChromedpIsTestOnly(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range parsed.Imports {
			require.NotContains(t, imp.Path.Value, "github.com/chromedp", "%s imports %s", f, imp.Path.Value)
		}
	}
}

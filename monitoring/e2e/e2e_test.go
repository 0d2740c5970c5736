// Package e2e_test runs the Grafana dashboard's queries and the Prometheus alert rules
// of the monitoring directory against a real Prometheus scraping real oncekit metrics:
// two deployments (Prometheus jobs) run ledger, outbox and inbox traffic against a
// throwaway PostgreSQL, with the faults the alerts watch for injected, and export their
// metrics with the OpenTelemetry Prometheus exporter; a Prometheus server on loopback
// scrapes both and evaluates the rules. Every dashboard query and every alert
// expression must return a series for each deployment, and every alert must be pending
// or firing for each, except the one listed in needsHistory.
//
// It is a module of its own so that the exporter (go.opentelemetry.io/otel/exporters/
// prometheus and the Prometheus client) is no dependency of the library. It skips, saying
// so, when the prometheus binary is not installed (on Debian: apt-get install prometheus).
package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

const (
	dashboardFile = "../oncekit-dashboard.json"
	alertsFile    = "../oncekit-alerts.yml"
)

// jobs are the two deployments one Prometheus scrapes.
var jobs = []string{"shop", "billing"}

// needsHistory are the alerts whose expression cannot hold in a short run, with why;
// alerts_test.yml (promtool) proves each of them instead, and this test checks that
// the series they are made of are there.
var needsHistory = map[string]struct{ why, operand string }{
	"OncekitOutboxBacklogGrowing": {
		why:     "deriv over a 15-minute subquery at 1-minute steps needs two minute-aligned points, and the run lasts seconds",
		operand: `max by (job) (oncekit_outbox_backlog{oncekit_state="pending"})`,
	},
}

func TestMain(m *testing.M) { pgtest.Main(m) }

// deployment is one job's oncekit: a ledger, an outbox and an inbox on a schema of its
// own, metered into a registry that its /metrics serves.
type deployment struct {
	job    string
	pool   *pgxpool.Pool
	schema string
	ledger *ledger.Ledger
	outbox *outbox.Outbox
	inbox  *inbox.Inbox
	// publish publishes the events of every topic but payments.refused, which the
	// broker refuses for good.
	dispatcher *outbox.Dispatcher
	addr       string
	n          int // iterations of traffic so far
}

func newDeployment(t *testing.T, job string) *deployment {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)

	reg := promclient.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	d := &deployment{job: job, pool: pool, schema: schema}
	d.ledger, err = ledger.New(pool, &ledger.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	d.outbox, err = outbox.New(pool, &outbox.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	d.inbox, err = inbox.New(pool, &inbox.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	d.dispatcher, err = outbox.NewDispatcher(d.outbox, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.Topic == "payments.refused" {
			return fmt.Errorf("broker: schema rejected: %w", outbox.ErrPermanent)
		}
		return nil
	}), nil)
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	d.addr = ln.Addr().String()
	return d
}

func (d *deployment) intent(op, key, payload string) ledger.Intent {
	fp, _ := keys.FingerprintJSON(payload)
	return ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: op}, Key: keys.Key(key), Fingerprint: fp}
}

// traffic runs one round of what a deployment does, the faults included, so that every
// counter rises between two scrapes: first executions and replays, a key reused, a
// call that waits for a held key, claims that complete, that end uncertain, that are
// left stuck and that lose their lease to a retry, calls that fail on the database,
// publications that succeed and that the broker refuses, messages handled, duplicated,
// rejected and failed, and the purges.
func (d *deployment) traffic(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	d.n++
	key := func(s string) string { return fmt.Sprintf("%s-%d", s, d.n) }
	create := func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 201}, nil }
	records := pgx.Identifier{d.schema, "idempotency_records"}.Sanitize()

	_, err := d.ledger.Do(ctx, d.intent("orders.create", key("o"), "a"), create, nil)
	require.NoError(t, err)
	res, err := d.ledger.Do(ctx, d.intent("orders.create", key("o"), "a"), create, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	_, err = d.ledger.Do(ctx, d.intent("orders.create", key("o"), "b"), create, nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)

	// An external call that completes, one whose outcome is unknown, and one that a
	// caller waits for while it is held.
	c, err := d.ledger.Claim(ctx, d.intent("payments.charge", key("done"), "a"), nil)
	require.NoError(t, err)
	_, err = d.ledger.Complete(ctx, c.Lease, ledger.Response{Code: 200})
	require.NoError(t, err)
	c, err = d.ledger.Claim(ctx, d.intent("payments.charge", key("unknown"), "a"), nil)
	require.NoError(t, err)
	require.NoError(t, d.ledger.MarkUncertain(ctx, c.Lease))
	_, err = d.ledger.Claim(ctx, d.intent("payments.charge", key("held"), "a"), &ledger.ClaimOpts{Lease: time.Hour})
	require.NoError(t, err)
	_, err = d.ledger.Do(ctx, d.intent("payments.charge", key("held"), "a"), create, &ledger.DoOpts{Wait: 200 * time.Millisecond})
	require.ErrorIs(t, err, ledger.ErrInProgress)

	// A worker that dies holding its claim: its lease runs out (moved into the past,
	// as time would), and the record is stuck.
	_, err = d.ledger.Claim(ctx, d.intent("payments.charge", key("stuck"), "a"), &ledger.ClaimOpts{Lease: time.Hour})
	require.NoError(t, err)
	_, err = d.pool.Exec(ctx, "UPDATE "+records+" SET lease_until = now() - interval '1 minute' WHERE key = $1", key("stuck"))
	require.NoError(t, err)
	// A slow worker: its lease runs out, a retry takes the key over and completes, and
	// the slow one's completion is refused.
	slow, err := d.ledger.Claim(ctx, d.intent("payments.charge", key("slow"), "a"), &ledger.ClaimOpts{Lease: time.Hour})
	require.NoError(t, err)
	_, err = d.pool.Exec(ctx, "UPDATE "+records+" SET lease_until = now() - interval '1 minute' WHERE key = $1", key("slow"))
	require.NoError(t, err)
	retry, err := d.ledger.Claim(ctx, d.intent("payments.charge", key("slow"), "a"), nil)
	require.NoError(t, err)
	require.True(t, retry.Lease.Redrive)
	_, err = d.ledger.Complete(ctx, retry.Lease, ledger.Response{Code: 200})
	require.NoError(t, err)
	_, err = d.ledger.Complete(ctx, slow.Lease, ledger.Response{Code: 200})
	require.ErrorIs(t, err, ledger.ErrLeaseLost)
	// Calls that end in an error: here their context is cancelled, as a database that
	// does not answer would leave them.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = d.ledger.Do(cancelled, d.intent("refunds.create", key("r"), "a"), create, nil)
	require.Error(t, err)
	_, err = d.ledger.Purge(ctx, nil)
	require.NoError(t, err)

	require.NoError(t, pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := d.outbox.Enqueue(ctx, tx, outbox.Event{Topic: "payments.captured", Payload: []byte(`{}`)},
			outbox.Event{Topic: "payments.refused", Payload: []byte(`{}`)})
		return err
	}))
	_, err = d.dispatcher.Drain(ctx)
	require.NoError(t, err)
	_, err = d.outbox.Purge(ctx, nil)
	require.NoError(t, err)

	msg := uuid.NewString()
	for range 2 {
		_, err = d.inbox.Handle(ctx, "ledger-lines", msg, func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, err)
	}
	_, err = d.inbox.Handle(ctx, "ledger-lines", uuid.NewString(), func(context.Context, pgx.Tx) error {
		return ledger.Definitive("bad_payload", "amount is not a number")
	})
	require.Error(t, err)
	_, err = d.inbox.Handle(ctx, "ledger-lines", uuid.NewString(), func(context.Context, pgx.Tx) error {
		return errors.New("the handler's database write failed")
	})
	require.Error(t, err)
	_, err = d.inbox.Purge(ctx, nil)
	require.NoError(t, err)
}

// prometheus starts a Prometheus server on loopback that scrapes the deployments every
// second and evaluates the alert rules every second, and returns its address once it
// is ready.
func startPrometheus(t *testing.T, bin string, deps []*deployment) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	var scrape strings.Builder
	for _, d := range deps {
		fmt.Fprintf(&scrape, "  - job_name: %s\n    static_configs:\n      - targets: ['%s']\n", d.job, d.addr)
	}
	config := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %s\nscrape_configs:\n%s", rules, scrape.String())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // Prometheus binds it; a race with another process is unlikely on loopback

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	logs, err := os.Create(filepath.Join(dir, "prometheus.log"))
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("prometheus's log:\n%s", b)
		}
	})

	ready := time.NewTicker(100 * time.Millisecond)
	defer ready.Stop()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("prometheus exited: %v\n%s", err, b)
		case <-deadline:
			t.Fatal("prometheus was not ready within 30 s")
		case <-ready.C:
			resp, err := http.Get("http://" + addr + "/-/ready")
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return addr
				}
			}
		}
	}
}

// series is a query's result: one label set per series.
type series []map[string]string

// query evaluates expr on Prometheus now.
func query(t *testing.T, addr, expr string) series {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(body, &r), "%s", body)
	require.Equal(t, "success", r.Status, "%s: %s", expr, r.Error)
	var out series
	for _, s := range r.Data.Result {
		out = append(out, s.Metric)
	}
	return out
}

// jobsOf returns the jobs s has series of.
func (s series) jobsOf() []string {
	var out []string
	for _, m := range s {
		if !slices.Contains(out, m["job"]) {
			out = append(out, m["job"])
		}
	}
	slices.Sort(out)
	return out
}

// expressions returns every dashboard query, with Grafana's variables set as a
// dashboard showing every job and operation sets them, and every alert expression.
func expressions(t *testing.T) (dashboard map[string]string, alerts map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	vars := strings.NewReplacer(`$job`, `.*`, `$operation`, `.*`, `$__rate_interval`, `5s`, `$__range`, `1m`)
	dashboard = map[string]string{}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			dashboard[fmt.Sprintf("%s #%d", p.Title, i+1)] = vars.Replace(tg.Expr)
		}
	}
	raw, err = os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	alerts = map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r.Expr
		}
	}
	return dashboard, alerts
}

// A real Prometheus, scraping two deployments' real metrics, finds a series of each
// deployment for every dashboard query and every alert expression, and has every
// alert pending or firing for each deployment, but those in needsHistory.
func TestPrometheusEndToEnd(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed: on Debian, apt-get install prometheus (CI installs it)")
	}
	dashboard, alerts := expressions(t)
	require.NotEmpty(t, dashboard)
	require.NotEmpty(t, alerts)
	var deps []*deployment
	for _, job := range jobs {
		deps = append(deps, newDeployment(t, job))
	}
	addr := startPrometheus(t, bin, deps)

	// What is still missing, by check; the run ends when nothing is.
	missing := func() []string {
		var out []string
		want := slices.Sorted(slices.Values(jobs))
		for name, expr := range dashboard {
			if got := query(t, addr, expr).jobsOf(); !slices.Equal(got, want) {
				out = append(out, fmt.Sprintf("dashboard panel %q (%s) has series of %v", name, expr, got))
			}
		}
		for name, expr := range alerts {
			if h, ok := needsHistory[name]; ok {
				expr = h.operand
			}
			if got := query(t, addr, expr).jobsOf(); !slices.Equal(got, want) {
				out = append(out, fmt.Sprintf("alert %s (%s) has series of %v", name, expr, got))
			}
		}
		active := map[string][]string{}
		for _, a := range activeAlerts(t, addr) {
			active[a.name] = append(active[a.name], a.job)
		}
		for name := range alerts {
			if _, ok := needsHistory[name]; ok {
				continue
			}
			if got := slices.Sorted(slices.Values(active[name])); !slices.Equal(slices.Compact(got), want) {
				out = append(out, fmt.Sprintf("alert %s is pending or firing for %v", name, got))
			}
		}
		slices.Sort(out)
		return out
	}

	start := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(45 * time.Second)
	var left []string
	for rounds := 0; ; rounds++ {
		for _, d := range deps {
			d.traffic(t)
		}
		// Two scrapes at least, so that every counter has a rate.
		if rounds >= 4 {
			if left = missing(); len(left) == 0 {
				break
			}
		}
		select {
		case <-deadline:
			t.Fatalf("after 45 s, still:\n%s", strings.Join(left, "\n"))
		case <-tick.C:
		}
	}
	t.Logf("every dashboard query (%d) and alert expression (%d) returned series of both jobs, and %d alerts were active for both, after %s; not evaluated whole: %v",
		len(dashboard), len(alerts), len(alerts)-len(needsHistory), time.Since(start).Round(100*time.Millisecond), slices.Sorted(maps.Keys(needsHistory)))
	for name, h := range needsHistory {
		t.Logf("%s: %s (alerts_test.yml proves it with promtool)", name, h.why)
	}

	// The rule file as Prometheus loaded it: every rule, none unhealthy.
	resp, err := http.Get("http://" + addr + "/api/v1/rules")
	require.NoError(t, err)
	defer resp.Body.Close()
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rules))
	loaded := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			loaded++
			require.Equal(t, "ok", r.Health, "%s: %s", r.Name, r.LastError)
		}
	}
	require.Equal(t, len(alerts), loaded)
}

type alert struct{ name, job string }

// activeAlerts returns the alerts pending or firing now.
func activeAlerts(t *testing.T, addr string) []alert {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/alerts")
	require.NoError(t, err)
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	var out []alert
	for _, a := range r.Data.Alerts {
		if a.State == "pending" || a.State == "firing" {
			out = append(out, alert{a.Labels["alertname"], a.Labels["job"]})
		}
	}
	return out
}

// Package monitoring_test checks the Grafana dashboard and the Prometheus alert rules in
// this directory against what oncekit records: the ledger, the outbox and the inbox run
// against a real PostgreSQL with the OpenTelemetry SDK, their metrics are named as
// Prometheus names them, and every metric, label and label value the two files use must
// be among them.
package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.yaml.in/yaml/v3"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

const (
	dashboardFile = "oncekit-dashboard.json"
	alertsFile    = "oncekit-alerts.yml"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exported is what oncekit's packages exported, as Prometheus names it.
type exported struct {
	// series are the names of the series: a counter's with _total, a histogram's
	// _bucket, _sum and _count.
	series map[string]bool
	// families maps each series to its metric's Prometheus name (without _bucket and
	// so on).
	families map[string]string
	// labels maps each label to the values it took.
	labels map[string]map[string]bool
}

// unitSuffixes are the units Prometheus's default translation spells out in a name;
// an annotation in braces, such as {call}, is dropped.
var unitSuffixes = map[string]string{"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}

var invalidNameChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// promName names m as Prometheus's default translation of OpenTelemetry metrics does
// (UnderscoreEscapingWithSuffixes: the OTLP receiver's default, the Collector's and the
// Go exporter's): invalid characters become underscores, then the unit's suffix and a
// counter's _total are added.
func promName(m metricdata.Metrics) (string, []string) {
	name := invalidNameChars.ReplaceAllString(m.Name, "_")
	if s, ok := unitSuffixes[m.Unit]; ok && !strings.HasSuffix(name, "_"+s) {
		name += "_" + s
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		if d.IsMonotonic {
			return name, []string{name + "_total"}
		}
	case metricdata.Sum[float64]:
		if d.IsMonotonic {
			return name, []string{name + "_total"}
		}
	case metricdata.Histogram[float64]:
		return name, []string{name + "_bucket", name + "_sum", name + "_count"}
	}
	return name, []string{name}
}

// record runs the ledger, the outbox and the inbox through the paths the dashboard and
// the alerts watch (first executions, replays, a key reused, a wait that runs out, a
// claim left pending, publications that succeed and die, messages handled and
// duplicated, purges) and returns what they exported.
func record(t *testing.T) exported {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	l, err := ledger.New(pool, &ledger.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	intent := func(key, payload string) ledger.Intent {
		fp, err := keys.FingerprintJSON(payload)
		require.NoError(t, err)
		return ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "orders.create"}, Key: keys.Key(key), Fingerprint: fp}
	}
	create := func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{Code: 201}, nil }
	_, err = l.Do(ctx, intent("o-1", "a"), create, nil)
	require.NoError(t, err)
	res, err := l.Do(ctx, intent("o-1", "a"), create, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	_, err = l.Do(ctx, intent("o-1", "b"), create, nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
	_, err = l.Claim(ctx, intent("c-1", "a"), &ledger.ClaimOpts{Lease: time.Hour})
	require.NoError(t, err)
	// Long enough that the call polls the held key at least once, which the wait's
	// histogram records, however long the round trips before it take.
	_, err = l.Do(ctx, intent("c-1", "a"), create, &ledger.DoOpts{Wait: 500 * time.Millisecond})
	require.ErrorIs(t, err, ledger.ErrInProgress)
	_, err = l.Purge(ctx, nil)
	require.NoError(t, err)

	out, err := outbox.New(pool, &outbox.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "payments.captured", Payload: []byte(`{}`)},
			outbox.Event{Topic: "payments.refused", Payload: []byte(`{}`)})
		return err
	}))
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.Topic == "payments.refused" {
			return fmt.Errorf("broker refused it: %w", outbox.ErrPermanent)
		}
		return nil
	}), nil)
	require.NoError(t, err)
	_, err = d.Drain(ctx)
	require.NoError(t, err)
	_, err = out.Purge(ctx, nil)
	require.NoError(t, err)

	in, err := inbox.New(pool, &inbox.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)
	for range 2 {
		_, err = in.Handle(ctx, "ledger-lines", "m-1", func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, err)
	}
	_, err = in.Purge(ctx, nil)
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	e := exported{series: map[string]bool{}, families: map[string]string{}, labels: map[string]map[string]bool{}}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			family, series := promName(m)
			for _, s := range series {
				e.series[s] = true
				e.families[s] = family
			}
			for _, attrs := range attributeSets(m) {
				for _, kv := range attrs {
					label := invalidNameChars.ReplaceAllString(string(kv.Key), "_")
					if e.labels[label] == nil {
						e.labels[label] = map[string]bool{}
					}
					e.labels[label][kv.Value.String()] = true
				}
			}
		}
	}
	// The outcomes the run did not reach are values of the same label all the same.
	for _, o := range []string{ledger.OutcomeFirst, ledger.OutcomeReplay, ledger.OutcomeFailed, ledger.OutcomeKeyReused,
		ledger.OutcomeInProgress, ledger.OutcomeSnapshotConflict, ledger.OutcomeRedrive, ledger.OutcomeCompleted,
		ledger.OutcomeReleased, ledger.OutcomeUncertain, ledger.OutcomeLeaseLost, ledger.OutcomeError} {
		e.labels["oncekit_outcome"][o] = true
	}
	return e
}

// attributeSets returns the attributes of each of m's data points.
func attributeSets(m metricdata.Metrics) [][]attribute.KeyValue {
	var out [][]attribute.KeyValue
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes.ToSlice())
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes.ToSlice())
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes.ToSlice())
		}
	}
	return out
}

var (
	// metricToken finds oncekit's metric and label names in a file.
	metricToken = regexp.MustCompile(`\boncekit_[a-z0-9_]+`)
	// matcher finds a label matcher: the label, the operator and the value.
	matcher = regexp.MustCompile(`\b(oncekit_[a-z0-9_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// reporter is where checkNames reports: a test, or a recorder in the test of the check.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// checkNames checks that every oncekit_ name in text is a series or a label oncekit
// exports, that every value a label is matched against is one it takes, and returns
// the metric families text uses.
func checkNames(t reporter, file, text string, e exported) map[string]bool {
	t.Helper()
	used := map[string]bool{}
	for _, name := range metricToken.FindAllString(text, -1) {
		switch {
		case e.series[name]:
			used[e.families[name]] = true
		case e.labels[name] != nil:
		default:
			t.Errorf("%s names %s, which oncekit does not export (it exports %s)", file, name, strings.Join(sortedKeys(e.series), ", "))
		}
	}
	for _, m := range matcher.FindAllStringSubmatch(text, -1) {
		label, value := m[1], m[3]
		if e.labels[label] == nil || strings.Contains(value, "$") {
			continue // not a label (reported above), or a dashboard variable
		}
		for _, v := range strings.Split(value, "|") {
			if !e.labels[label][v] && v != ".*" {
				t.Errorf("%s matches %s against %q, a value it never takes (it takes %s)", file, label, v, strings.Join(sortedKeys(e.labels[label]), ", "))
			}
		}
	}
	return used
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The dashboard is a Grafana dashboard whose queries name what oncekit exports, and it
// shows every metric oncekit exports.
func TestDashboard(t *testing.T) {
	t.Parallel()
	e := record(t)
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash), "%s is not JSON", dashboardFile)
	require.NotEmpty(t, dash.UID)
	require.NotEmpty(t, dash.Title)
	var variables []string
	for _, v := range dash.Templating.List {
		variables = append(variables, v.Name)
	}
	require.Contains(t, variables, "datasource", "the dashboard asks for its Prometheus data source")
	var exprs []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			exprs = append(exprs, tg.Expr)
		}
	}
	require.Contains(t, variables, "job", "the dashboard picks a deployment")
	for _, expr := range exprs {
		checkByJob(t, dashboardFile, expr)
		require.Equal(t, len(selector.FindAllString(expr, -1)), strings.Count(expr, `job=~"$job"`), "%s: every selector of %s matches $job", dashboardFile, expr)
	}
	used := checkNames(t, dashboardFile, string(raw), e)
	for _, family := range sortedKeys(invert(e.families)) {
		require.True(t, used[family], "no panel of %s shows %s", dashboardFile, family)
	}
	require.NotEmpty(t, exprs)
}

func invert(m map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range m {
		out[v] = true
	}
	return out
}

// The alert rules are Prometheus rules whose expressions name what oncekit exports, and
// they watch stuck records, dead events, the backlog and reused keys.
func TestAlerts(t *testing.T) {
	t.Parallel()
	e := record(t)
	raw, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules), "%s is not YAML", alertsFile)
	require.NotEmpty(t, rules.Groups)
	var alerts []string
	for _, g := range rules.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Expr, r.Alert)
			require.NotEmpty(t, r.Labels["severity"], "%s has no severity", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "%s has no summary", r.Alert)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				require.NoError(t, err, "%s: for", r.Alert)
			}
			alerts = append(alerts, r.Alert)
			checkNames(t, alertsFile+": "+r.Alert, r.Expr, e)
			checkByJob(t, alertsFile+": "+r.Alert, r.Expr)
		}
	}
	checkNames(t, alertsFile, string(raw), e)
	for _, want := range []string{"OncekitStuckPendingRecords", "OncekitDeadEvents", "OncekitOutboxBacklogGrowing", "OncekitKeyReused",
		"OncekitUncertainOutcomes", "OncekitLeaseLost", "OncekitInboxErrors"} {
		require.Contains(t, alerts, want)
	}
}

// The check itself: a name oncekit does not export, and a label value it never takes,
// are reported.
func TestCheckNamesReportsUnknownNames(t *testing.T) {
	t.Parallel()
	e := exported{series: map[string]bool{"oncekit_ledger_calls_total": true},
		families: map[string]string{"oncekit_ledger_calls_total": "oncekit_ledger_calls"},
		labels:   map[string]map[string]bool{"oncekit_outcome": {"first": true}}}
	rec := &recorder{}
	used := checkNames(rec, "x", `sum(oncekit_ledger_calls_total{oncekit_outcome="first"})`, e)
	require.Empty(t, rec.errs)
	require.Equal(t, map[string]bool{"oncekit_ledger_calls": true}, used)
	checkNames(rec, "x", `oncekit_ledger_call_total{oncekit_outcome=~"first|replayed"}`, e)
	require.Len(t, rec.errs, 2, "%v", rec.errs)
	require.Contains(t, rec.errs[0], "oncekit_ledger_call_total")
	require.Contains(t, rec.errs[1], `"replayed"`)
}

var (
	// aggregation finds an aggregation and its by clause, if any.
	aggregation = regexp.MustCompile(`\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(`)
	// selector finds a selector of one of oncekit's series.
	selector = regexp.MustCompile(`\boncekit_[a-z0-9_]+\{`)
)

// checkByJob checks that every aggregation in expr keeps the job label, so that two
// deployments one Prometheus scrapes are not merged.
func checkByJob(t reporter, file, expr string) {
	t.Helper()
	for _, m := range aggregation.FindAllStringSubmatch(expr, -1) {
		by := strings.Split(m[2], ",")
		for i := range by {
			by[i] = strings.TrimSpace(by[i])
		}
		if !slices.Contains(by, "job") {
			t.Errorf("%s: %q aggregates without by (job): two deployments would merge", file, m[0])
		}
	}
}

// The job check reports an aggregation that drops the job.
func TestCheckByJobReportsMergedJobs(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	checkByJob(rec, "x", `max by (job) (a) and sum by (job, le) (b) / count by (le,job) (c)`)
	require.Empty(t, rec.errs)
	checkByJob(rec, "x", `max(a) > 0 and sum by (oncekit_topic) (b)`)
	require.Len(t, rec.errs, 2, "%v", rec.errs)
}

// recorder keeps what a check reports.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

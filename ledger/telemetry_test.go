package ledger_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/ledger"
)

// telemetryProbe collects what a ledger reports, in memory.
type telemetryProbe struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
	logs   *bytes.Buffer
}

func withTelemetry(cfg *ledger.Config) *telemetryProbe {
	p := &telemetryProbe{reader: sdkmetric.NewManualReader(), spans: tracetest.NewInMemoryExporter(), logs: &bytes.Buffer{}}
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(p.spans))
	cfg.Logger = slog.New(slog.NewTextHandler(p.logs, nil))
	return p
}

// calls sums oncekit.ledger.calls by "call/outcome".
func (p *telemetryProbe) calls(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, p.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "oncekit.ledger.calls" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				call, _ := dp.Attributes.Value(attribute.Key(ledger.AttrCall))
				outcome, _ := dp.Attributes.Value(attribute.Key(ledger.AttrOutcome))
				op, _ := dp.Attributes.Value(attribute.Key(ledger.AttrOperation))
				require.Equal(t, "orders.create", op.AsString())
				out[call.AsString()+"/"+outcome.AsString()] += dp.Value
			}
		}
	}
	return out
}

// The ledger's metrics and spans say what each call did: a first execution, a replay, a
// key reused with another payload, a re-drive after a lease ran out (logged too).
func TestTelemetry_MetricsSpansAndLogs(t *testing.T) {
	t.Parallel()
	cfg := &ledger.Config{}
	probe := withTelemetry(cfg)
	l, b := setup(t, cfg)
	ctx := context.Background()
	req := order{Item: "lamp", Amount: 100}
	in := intent(t, "acme", "order-1", req)
	in.Scope.Operation = "orders.create"

	_, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	res, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	other := intent(t, "acme", "order-1", order{Item: "lamp", Amount: 999})
	other.Scope.Operation = "orders.create"
	_, err = l.Do(ctx, other, createOrder("acme", req), nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)

	ext := intent(t, "acme", "charge-1", req)
	ext.Scope.Operation = "orders.create"
	first, err := l.Claim(ctx, ext, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute) // the owner died; its lease runs out
	second, err := l.Claim(ctx, ext, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.True(t, second.Lease.Redrive)
	_, err = l.Complete(ctx, first.Lease, ledger.Response{Body: []byte(`1`)})
	require.ErrorIs(t, err, ledger.ErrLeaseLost)
	_, err = l.Complete(ctx, second.Lease, ledger.Response{Body: []byte(`1`)})
	require.NoError(t, err)

	require.Equal(t, map[string]int64{
		"Do/first": 1, "Do/replay": 1, "Do/key_reused": 1,
		"Claim/first": 1, "Claim/redrive": 1, "Complete/lease_lost": 1, "Complete/completed": 1,
	}, probe.calls(t))

	spans := probe.spans.GetSpans()
	require.Len(t, spans, 7)
	require.Equal(t, "oncekit.ledger.Do", spans[0].Name)
	attrs := map[attribute.Key]string{}
	for _, a := range spans[0].Attributes {
		attrs[a.Key] = a.Value.AsString()
	}
	require.Equal(t, map[attribute.Key]string{ledger.AttrTenant: "acme", ledger.AttrOperation: "orders.create", ledger.AttrOutcome: "first"}, attrs,
		"the scope and outcome, never the key or the body")
	// A call's span is a child of the span in the caller's context, such as the
	// activity span Temporal's tracing interceptor starts.
	parentCtx, parent := cfg.TracerProvider.Tracer("caller").Start(ctx, "RunActivity:orders.create")
	_, err = l.Do(parentCtx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	parent.End()
	all := probe.spans.GetSpans()
	child := all[len(all)-2]
	require.Equal(t, "oncekit.ledger.Do", child.Name)
	require.Equal(t, parent.SpanContext().SpanID(), child.Parent.SpanID())
	require.Equal(t, parent.SpanContext().TraceID(), child.SpanContext.TraceID())

	require.Contains(t, probe.logs.String(), "taken over")
	require.Contains(t, probe.logs.String(), "oncekit.attempt=2")
}

// Without providers, nothing is recorded and nothing fails.
func TestTelemetry_OffByDefault(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	in := intent(t, "acme", "quiet", order{Item: "x", Amount: 1})
	_, err := l.Do(context.Background(), in, func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{}, nil }, nil)
	require.NoError(t, err)
	_, err = l.Purge(context.Background(), nil)
	require.NoError(t, err)
}

// Out of the box, without a View: durations fall into buckets from a millisecond up,
// the meter's and the tracer's scopes carry a version, calls carry their span as an
// exemplar, and pending claims are counted by lease.
func TestTelemetry_OutOfTheBox(t *testing.T) {
	t.Parallel()
	cfg := &ledger.Config{}
	probe := withTelemetry(cfg)
	l, b := setup(t, cfg)
	ctx := context.Background()
	req := order{Item: "lamp", Amount: 1}
	in := intent(t, "acme", "exemplar-1", req)
	callerCtx, caller := cfg.TracerProvider.Tracer("caller").Start(ctx, "caller")
	_, err := l.Do(callerCtx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	caller.End()
	_, err = l.Claim(ctx, intent(t, "acme", "live", req), &ledger.ClaimOpts{Lease: time.Hour})
	require.NoError(t, err)
	_, err = l.Claim(ctx, intent(t, "acme", "stuck", req), &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)

	var rm metricdata.ResourceMetrics
	require.NoError(t, probe.reader.Collect(ctx, &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	require.Equal(t, ledger.InstrumentationName, rm.ScopeMetrics[0].Scope.Name)
	require.NotEmpty(t, rm.ScopeMetrics[0].Scope.Version)
	pending := map[string]int64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch m.Name {
		case "oncekit.ledger.call.duration":
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				require.Equal(t, 0.001, dp.Bounds[0], "seconds, from a millisecond")
				require.Equal(t, 10.0, dp.Bounds[len(dp.Bounds)-1])
			}
		case "oncekit.ledger.calls":
			var exemplars []metricdata.Exemplar[int64]
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				exemplars = append(exemplars, dp.Exemplars...)
			}
			require.NotEmpty(t, exemplars, "the calls are recorded with their context")
			var traces []string
			for _, e := range exemplars {
				traces = append(traces, hex.EncodeToString(e.TraceID))
			}
			require.Contains(t, traces, caller.SpanContext().TraceID().String())
		case "oncekit.ledger.pending":
			for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				lease, _ := dp.Attributes.Value(attribute.Key(ledger.AttrLease))
				pending[lease.AsString()] = dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"live": 1, "expired": 1}, pending)
	spans := probe.spans.GetSpans()
	require.NotEmpty(t, spans)
	for _, sp := range spans {
		if sp.InstrumentationScope.Name == ledger.InstrumentationName {
			require.Equal(t, rm.ScopeMetrics[0].Scope.Version, sp.InstrumentationScope.Version, "the tracer carries the version too")
		}
	}
}

// A pool, a connection and a transaction each begin what the ledger runs in.
var (
	_ ledger.Beginner = (*pgxpool.Pool)(nil)
	_ ledger.Beginner = (*pgx.Conn)(nil)
	_ ledger.Beginner = pgx.Tx(nil)
)

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want any
	}{
		{ledger.OutcomeFirst, "first"}, {ledger.OutcomeReplay, "replay"}, {ledger.OutcomeFailed, "failed"},
		{ledger.OutcomeKeyReused, "key_reused"}, {ledger.OutcomeInProgress, "in_progress"},
		{ledger.OutcomeSnapshotConflict, "snapshot_conflict"}, {ledger.OutcomeRedrive, "redrive"},
		{ledger.OutcomeCompleted, "completed"}, {ledger.OutcomeReleased, "released"},
		{ledger.OutcomeUncertain, "uncertain"}, {ledger.OutcomeLeaseLost, "lease_lost"}, {ledger.OutcomeError, "error"},
		{ledger.MigrationLine, "ledger"},
		{ledger.MaxBodyDefault, 1 << 20},
		{ledger.ListLimitDefault, 100},
		{ledger.PurgeBatchDefault, 500}, {ledger.PurgePauseDefault, 50 * time.Millisecond},
		// PostgreSQL's longest lock_timeout, 2^31-1 ms.
		{ledger.MaxWait, time.Duration(1<<31-1) * time.Millisecond},
	} {
		require.Equal(t, c.want, c.got)
	}
}

// OutcomeOf names what a call returned as the ledger's metrics do.
func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		res  ledger.Result
		err  error
		want string
	}{
		{ledger.Result{}, nil, ledger.OutcomeFirst},
		{ledger.Result{Replayed: true}, nil, ledger.OutcomeReplay},
		{ledger.Result{}, ledger.Definitive("declined", "no"), ledger.OutcomeFailed},
		{ledger.Result{}, &ledger.DefinitiveError{Code: "declined", Replayed: true}, ledger.OutcomeReplay},
		{ledger.Result{}, fmt.Errorf("call: %w", ledger.ErrFingerprintMismatch), ledger.OutcomeKeyReused},
		{ledger.Result{}, ledger.ErrInProgress, ledger.OutcomeInProgress},
		{ledger.Result{}, ledger.ErrSnapshotConflict, ledger.OutcomeSnapshotConflict},
		{ledger.Result{}, errors.New("connection refused"), ledger.OutcomeError},
	} {
		require.Equal(t, c.want, ledger.OutcomeOf(c.res, c.err), "%v", c.err)
	}
}

// A mutation that returns a result although one of its statements failed stores
// nothing: its writes cannot commit, and Do says so.
func TestDo_ResultAfterAbortedStatementIsRefused(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "aborted-1", order{Item: "lamp", Amount: 1})
	_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, _ = tx.Exec(ctx, "SELECT 1/0") // leaves the transaction aborted; the error is dropped
		return ledger.Response{Code: 200}, nil
	}, nil)
	require.ErrorIs(t, err, ledger.ErrTxAborted)
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound, "nothing was stored")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n))
	require.Zero(t, n)
}

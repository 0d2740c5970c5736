package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/outbox"
)

// A published event and a dead one show in the outbox's metrics, spans and log.
func TestTelemetry_PublishedAndDeadEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	var logs bytes.Buffer
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema,
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)),
		Logger:         slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	b.out = out
	good := b.produce(t, "acc-good", 1)
	bad := b.produce(t, "acc-bad", 2)
	d := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.ID == bad {
			return errors.Join(outbox.ErrPermanent, errors.New("the consumer refuses this payload"))
		}
		return nil
	}), nil)
	b.drain(t, d)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					sums[m.Name] += dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					state, _ := dp.Attributes.Value("oncekit.state")
					sums[m.Name+"/"+state.AsString()] = dp.Value
				}
			}
		}
	}
	require.Equal(t, int64(1), sums["oncekit.outbox.published"])
	require.Equal(t, int64(1), sums["oncekit.outbox.publish.failed"])
	require.Equal(t, int64(1), sums["oncekit.outbox.dead"])
	require.Equal(t, int64(1), sums["oncekit.outbox.backlog/dead"])
	require.Equal(t, int64(0), sums["oncekit.outbox.backlog/pending"])

	got := map[string]string{}
	for _, s := range spans.GetSpans() {
		if s.Name == "oncekit.outbox.enqueue" {
			continue
		}
		require.Equal(t, "oncekit.outbox.publish", s.Name)
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				got[a.Value.AsString()] = s.Status.Code.String()
			}
		}
	}
	require.Equal(t, map[string]string{good.String(): "Unset", bad.String(): "Error"}, got)
	require.Contains(t, logs.String(), "an outbox event is dead")
	require.Contains(t, logs.String(), bad.String())
}

// A trace crosses the outbox: Enqueue has a span in the producer's trace and keeps its
// context with the event (through the configured propagator); the publication's span
// links to it; the consumer's inbox span is a child of the publication's. All carry the
// OpenTelemetry messaging attributes.
func TestTelemetry_TraceCrossesTheOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema, TracerProvider: tp, Propagator: prop})
	require.NoError(t, err)
	in, err := inbox.New(b.pool, &inbox.Config{Schema: b.schema, TracerProvider: tp})
	require.NoError(t, err)

	member, err := baggage.NewMember("tenant", "bank")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	pctx, checkout := tp.Tracer("test").Start(baggage.ContextWithBaggage(ctx, bag), "checkout")
	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(pctx, b.pool, func(tx pgx.Tx) error {
		ids, err := out.Enqueue(pctx, tx, outbox.Event{Topic: "payments.captured", Payload: []byte(`{"amount":4200}`)})
		if err == nil {
			id = ids[0]
		}
		return err
	}))
	checkout.End()
	var kept map[string]string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT trace_context FROM outbox_events WHERE id = $1`, id).Scan(&kept))
	require.Contains(t, kept["traceparent"], checkout.SpanContext().TraceID().String())
	require.Equal(t, "tenant=bank", kept["baggage"], "the configured propagator wrote the context")

	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		_, err := in.Handle(ctx, "ledger-lines", e.ID.String(), func(context.Context, pgx.Tx) error { return nil })
		return err
	}), nil)
	require.NoError(t, err)
	_, err = d.Drain(ctx)
	require.NoError(t, err)

	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans.GetSpans() {
		byName[s.Name] = s
	}
	enqueue, publish, handle := byName["oncekit.outbox.enqueue"], byName["oncekit.outbox.publish"], byName["oncekit.inbox.handle"]
	require.Equal(t, checkout.SpanContext().SpanID(), enqueue.Parent.SpanID(), "Enqueue's span is a child of the producer's")
	require.Equal(t, trace.SpanKindProducer, enqueue.SpanKind)
	require.Contains(t, kept["traceparent"], enqueue.SpanContext.SpanID().String(), "the event keeps Enqueue's context")
	require.Len(t, publish.Links, 1)
	require.Equal(t, enqueue.SpanContext.TraceID(), publish.Links[0].SpanContext.TraceID())
	require.Equal(t, enqueue.SpanContext.SpanID(), publish.Links[0].SpanContext.SpanID(), "the publication links to the Enqueue")
	require.Equal(t, publish.SpanContext.SpanID(), handle.Parent.SpanID(), "the inbox's span is a child of the publication's")
	require.Equal(t, trace.SpanKindConsumer, handle.SpanKind)

	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, a := range s.Attributes {
			m[string(a.Key)] = a.Value.String()
		}
		return m
	}
	require.Subset(t, attrs(enqueue), map[string]string{"messaging.system": outbox.MessagingSystem, "messaging.operation.type": "create",
		"messaging.destination.name": "payments.captured", "messaging.message.id": id.String()})
	require.Subset(t, attrs(publish), map[string]string{"messaging.system": outbox.MessagingSystem, "messaging.operation.type": "send",
		"messaging.destination.name": "payments.captured", "messaging.message.id": id.String(), "messaging.message.body.size": "15"})
	require.Subset(t, attrs(handle), map[string]string{"messaging.operation.type": "process", "messaging.consumer.group.name": "ledger-lines",
		"messaging.message.id": id.String(), "oncekit.outcome": "handled"})
}

// Without a trace in the producer's context, nothing is kept with the event.
func TestTelemetry_NoTraceNoContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.produce(t, "acc", 1)
	var kept *string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT trace_context::text FROM outbox_events WHERE id = $1`, id).Scan(&kept))
	require.Nil(t, kept)
}

// The backlog gauge counts pending and dead events from their indexes: however many
// published events the table keeps, its statement reads none of them.
func TestTelemetry_BacklogReadsNoPublishedEvent(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("on Citus the plan is the node's, inside Citus's own scan")
	}
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox_events (id, topic, payload, state, published_at)
		SELECT gen_random_uuid(), 't', '\x'::bytea, 'published', now() FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO outbox_events (id, topic, payload, state)
		SELECT gen_random_uuid(), 't', '\x'::bytea, s FROM unnest(ARRAY['pending', 'pending', 'dead']) s`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `ANALYZE outbox_events`)
	require.NoError(t, err)
	var plan []map[string]any
	require.NoError(t, b.pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+outbox.BacklogSQL(b.out)).Scan(&plan))
	var scans []string
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		if rel, ok := node["Relation Name"].(string); ok && rel == "outbox_events" {
			scans = append(scans, fmt.Sprintf("%s on %v", node["Node Type"], node["Index Name"]))
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	require.ElementsMatch(t, []string{"Index Only Scan on outbox_events_pending_idx", "Index Only Scan on outbox_events_dead_idx"}, scans)

	reader := sdkmetric.NewManualReader()
	_, err = outbox.New(b.pool, &outbox.Config{Schema: b.schema, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "oncekit.outbox.backlog" {
				for _, dp := range g.DataPoints {
					state, _ := dp.Attributes.Value("oncekit.state")
					got[state.AsString()] = dp.Value
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"pending": 2, "dead": 1}, got)
}

package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/otelx"
)

// InstrumentationName names the meter and tracer of the outbox.
const InstrumentationName = "github.com/oncekit/oncekit/outbox"

// AttrTopic is the attribute carrying an event's topic on the outbox's metrics and log
// lines, which also carry AttrEventID. Spans carry the OpenTelemetry messaging
// attributes instead: messaging.destination.name for the topic, messaging.message.id for
// the event ID.
const (
	AttrTopic   = "oncekit.topic"
	AttrEventID = "oncekit.event_id"
)

// MessagingSystem is the messaging.system attribute of the outbox's spans.
const MessagingSystem = "oncekit.outbox"

type telemetry struct {
	metrics   bool
	published metric.Int64Counter
	failed    metric.Int64Counter
	dead      metric.Int64Counter
	purged    metric.Int64Counter
	duration  metric.Float64Histogram
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	log       *slog.Logger
}

func newTelemetry(c *Config, o *Outbox) (*telemetry, error) {
	setup := otelx.New(InstrumentationName, c.MeterProvider, c.TracerProvider, c.Logger)
	t := &telemetry{log: setup.Log, tracer: setup.Tracer, prop: c.Propagator}
	if t.prop == nil {
		t.prop = propagation.TraceContext{}
	}
	m := setup.Meter
	if m == nil {
		return t, nil
	}
	in := otelx.Instruments{Meter: m}
	t.published = in.Counter("oncekit.outbox.published", "{event}", "Events published, by topic.")
	t.failed = in.Counter("oncekit.outbox.publish.failed", "{event}", "Failed publications, retried later or moved to dead.")
	t.dead = in.Counter("oncekit.outbox.dead", "{event}", "Events moved to the dead state.")
	t.purged = in.Counter("oncekit.outbox.purge.deleted", "{event}", "Published events deleted by Purge.")
	t.duration = in.Histogram("oncekit.outbox.publish.duration", "Duration of one publication.")
	if in.Err != nil {
		return nil, in.Err
	}
	// The backlog is counted when the metrics are collected, from the partial indexes of
	// pending and dead events: published events are not read.
	if _, err := m.Int64ObservableGauge("oncekit.outbox.backlog", metric.WithUnit("{event}"),
		metric.WithDescription("Events not published, by state (pending, dead), counted at collection."),
		metric.WithInt64Callback(func(ctx context.Context, obs metric.Int64Observer) error {
			pending, dead, err := o.backlog(ctx)
			if err != nil {
				return err
			}
			obs.Observe(pending, metric.WithAttributes(attribute.String("oncekit.state", "pending")))
			obs.Observe(dead, metric.WithAttributes(attribute.String("oncekit.state", "dead")))
			return nil
		})); err != nil {
		return nil, err
	}
	t.metrics = true
	return t, nil
}

func noEnd(error) {}

// enqueue starts the span of an Enqueue call: the messaging "create" operation, whose
// context each event keeps.
func (t *telemetry) enqueue(ctx context.Context, events []Event, ids []uuid.UUID) (context.Context, func(error)) {
	if t.tracer == nil {
		return ctx, noEnd
	}
	attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String(MessagingSystem),
		semconv.MessagingOperationTypeCreate, semconv.MessagingOperationName("enqueue")}
	if len(events) == 1 {
		attrs = append(attrs, semconv.MessagingDestinationName(events[0].Topic),
			semconv.MessagingMessageBodySize(len(events[0].Payload)), semconv.MessagingMessageID(ids[0].String()))
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(events)))
	}
	ctx, span := t.tracer.Start(ctx, "oncekit.outbox.enqueue", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// traceContext is the trace context to keep with the events enqueued in ctx, as JSON, or
// nil when the propagator writes nothing.
func (t *telemetry) traceContext(ctx context.Context) any {
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return map[string]string(carrier)
}

// link is the span context of the Enqueue that created an event, from the trace context
// kept with it.
func (t *telemetry) link(traceContext []byte) (trace.SpanContext, bool) {
	if len(traceContext) == 0 {
		return trace.SpanContext{}, false
	}
	var carrier propagation.MapCarrier
	if err := json.Unmarshal(traceContext, &carrier); err != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), carrier))
	return sc, sc.IsValid()
}

// publication instruments one publication: the messaging "send" operation. Its span
// links to the Enqueue that created the event; it is a client span, since the creation
// context is that Enqueue's.
func (t *telemetry) publication(ctx context.Context, e claimed, publish func(ctx context.Context) error) error {
	var span trace.Span
	if t.tracer != nil {
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			semconv.MessagingSystemKey.String(MessagingSystem), semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"), semconv.MessagingDestinationName(e.Topic),
			semconv.MessagingMessageID(e.ID.String()), semconv.MessagingMessageBodySize(len(e.Payload)))}
		if sc, ok := t.link(e.traceContext); ok {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		ctx, span = t.tracer.Start(ctx, "oncekit.outbox.publish", opts...)
	}
	start := time.Now()
	err := publish(ctx)
	if t.metrics {
		attrs := metric.WithAttributes(attribute.String(AttrTopic, e.Topic))
		t.duration.Record(ctx, time.Since(start).Seconds(), attrs)
		if err == nil {
			t.published.Add(ctx, 1, attrs)
		} else {
			t.failed.Add(ctx, 1, attrs)
		}
	}
	if span != nil {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	return err
}

// purge records a purge of published events.
func (t *telemetry) purge(ctx context.Context, deleted int64) {
	if t.metrics {
		t.purged.Add(ctx, deleted)
	}
	t.log.LogAttrs(ctx, slog.LevelInfo, "oncekit: purged published outbox events", slog.Int64("oncekit.deleted", deleted))
}

// died records an event moved to the dead state.
func (t *telemetry) died(ctx context.Context, e Event, attempts int, err error) {
	if t.metrics {
		t.dead.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrTopic, e.Topic)))
	}
	t.log.LogAttrs(ctx, slog.LevelError, "oncekit: an outbox event is dead: it will not be published again until retried",
		slog.String(AttrEventID, e.ID.String()), slog.String(AttrTopic, e.Topic), slog.Int("oncekit.attempts", attempts),
		slog.String("error", err.Error()))
}

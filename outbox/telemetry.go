package outbox

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/otelx"
)

// InstrumentationName names the meter and tracer of the outbox.
const InstrumentationName = "github.com/oncekit/oncekit/outbox"

// AttrTopic is the attribute carrying an event's topic on the outbox's metrics and
// spans; spans also carry AttrEventID.
const (
	AttrTopic   = "oncekit.topic"
	AttrEventID = "oncekit.event_id"
)

type telemetry struct {
	metrics   bool
	published metric.Int64Counter
	failed    metric.Int64Counter
	dead      metric.Int64Counter
	purged    metric.Int64Counter
	duration  metric.Float64Histogram
	tracer    trace.Tracer
	log       *slog.Logger
}

func newTelemetry(c *Config, o *Outbox) (*telemetry, error) {
	setup := otelx.New(InstrumentationName, c.MeterProvider, c.TracerProvider, c.Logger)
	t := &telemetry{log: setup.Log, tracer: setup.Tracer}
	m := setup.Meter
	if m == nil {
		return t, nil
	}
	in := otelx.Instruments{Meter: m}
	t.published = in.Counter("oncekit.outbox.published", "{event}", "Events published, by topic.")
	t.failed = in.Counter("oncekit.outbox.publish.failed", "{event}", "Failed publications, retried later or moved to dead.")
	t.dead = in.Counter("oncekit.outbox.dead", "{event}", "Events moved to the dead state.")
	t.purged = in.Counter("oncekit.outbox.purge.deleted", "{event}", "Published events deleted by PurgePublished.")
	t.duration = in.Histogram("oncekit.outbox.publish.duration", "Duration of one publication.")
	if in.Err != nil {
		return nil, in.Err
	}
	// The backlog is read from the table when the metrics are collected: one count query
	// per collection.
	if _, err := m.Int64ObservableGauge("oncekit.outbox.backlog", metric.WithUnit("{event}"),
		metric.WithDescription("Events by state (pending, dead), read at collection."),
		metric.WithInt64Callback(func(ctx context.Context, obs metric.Int64Observer) error {
			st, err := o.Stats(ctx)
			if err != nil {
				return err
			}
			obs.Observe(int64(st.Pending), metric.WithAttributes(attribute.String("oncekit.state", "pending")))
			obs.Observe(int64(st.Dead), metric.WithAttributes(attribute.String("oncekit.state", "dead")))
			return nil
		})); err != nil {
		return nil, err
	}
	t.metrics = true
	return t, nil
}

// publication instruments one publication.
func (t *telemetry) publication(ctx context.Context, e claimed, publish func(ctx context.Context) error) error {
	var span trace.Span
	if t.tracer != nil {
		ctx, span = t.tracer.Start(ctx, "oncekit.outbox.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String(AttrTopic, e.Topic), attribute.String(AttrEventID, e.ID.String())))
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

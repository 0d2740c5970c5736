package inbox

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/otelx"
	"github.com/oncekit/oncekit/keys"
)

// InstrumentationName names the meter and tracer of the inbox.
const InstrumentationName = "github.com/oncekit/oncekit/inbox"

// Attributes of the inbox's metrics: the subscriber, and the outcome of a message
// (handled, duplicate, rejected, error).
const (
	AttrSubscriber = "oncekit.subscriber"
	AttrOutcome    = "oncekit.outcome"
)

type telemetry struct {
	metrics  bool
	messages metric.Int64Counter
	purged   metric.Int64Counter
	tracer   trace.Tracer
	log      *slog.Logger
}

func newTelemetry(c *Config) (*telemetry, error) {
	o := otelx.New(InstrumentationName, c.MeterProvider, c.TracerProvider, c.Logger)
	t := &telemetry{log: o.Log, tracer: o.Tracer}
	m := o.Meter
	if m == nil {
		return t, nil
	}
	in := otelx.Instruments{Meter: m}
	t.messages = in.Counter("oncekit.inbox.messages", "{message}", "Messages, by subscriber and outcome (handled, duplicate, rejected, error).")
	t.purged = in.Counter("oncekit.inbox.purge.deleted", "{message}", "Expired inbox records deleted by purges.")
	if in.Err != nil {
		return nil, in.Err
	}
	t.metrics = true
	return t, nil
}

func (t *telemetry) message(ctx context.Context, subscriber string, res Result, err error) {
	if !t.metrics {
		return
	}
	t.messages.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrSubscriber, subscriber), attribute.String(AttrOutcome, outcome(res, err))))
}

// outcome names what became of a message. A first rejection returns the handler's
// definitive error beside Result.Rejected: it is a rejection, not an error.
func outcome(res Result, err error) string {
	switch {
	case res.Duplicate:
		return "duplicate"
	case res.Rejected:
		return "rejected"
	case err != nil:
		return "error"
	}
	return "handled"
}

// handle starts the span of a Handle call, oncekit.inbox.handle: the messaging
// "process" operation, a child of ctx's span (the delivery's), with the subscriber as
// the consumer group; the returned func ends it and counts the message.
func (t *telemetry) handle(ctx context.Context, subscriber, messageID string) (context.Context, func(Result, error)) {
	if t.tracer == nil {
		return ctx, func(res Result, err error) { t.message(ctx, subscriber, res, err) }
	}
	attrs := []attribute.KeyValue{semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("handle")}
	// Names past their limits are refused by Handle, and stay out of the span.
	if len(subscriber) <= keys.MaxScopeLen {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(subscriber))
	}
	if len(messageID) <= keys.MaxLenDefault {
		attrs = append(attrs, semconv.MessagingMessageID(messageID))
	}
	ctx, span := t.tracer.Start(ctx, "oncekit.inbox.handle", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx, func(res Result, err error) {
		t.message(ctx, subscriber, res, err)
		span.SetAttributes(attribute.String(AttrOutcome, outcome(res, err)))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

func (t *telemetry) purge(ctx context.Context, deleted int64) {
	if t.metrics {
		t.purged.Add(ctx, deleted)
	}
	t.log.LogAttrs(ctx, slog.LevelInfo, "oncekit: purged expired inbox records", slog.Int64("oncekit.deleted", deleted))
}

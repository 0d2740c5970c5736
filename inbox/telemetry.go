package inbox

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncekit/oncekit/internal/otelx"
)

// InstrumentationName names the meter of the inbox.
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
	log      *slog.Logger
}

func newTelemetry(c *Config) (*telemetry, error) {
	o := otelx.New(InstrumentationName, c.MeterProvider, nil, c.Logger)
	t := &telemetry{log: o.Log}
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
	outcome := "handled"
	switch {
	case err != nil:
		outcome = "error"
	case res.Duplicate:
		outcome = "duplicate"
	case res.Rejected:
		outcome = "rejected"
	}
	t.messages.Add(ctx, 1, metric.WithAttributes(attribute.String(AttrSubscriber, subscriber), attribute.String(AttrOutcome, outcome)))
}

func (t *telemetry) purge(ctx context.Context, deleted int64) {
	if t.metrics {
		t.purged.Add(ctx, deleted)
	}
	t.log.LogAttrs(ctx, slog.LevelInfo, "oncekit: purged expired inbox records", slog.Int64("oncekit.deleted", deleted))
}

package ledger

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/otelx"
	"github.com/oncekit/oncekit/keys"
)

// InstrumentationName names the meter and tracer of the ledger.
const InstrumentationName = "github.com/oncekit/oncekit/ledger"

// The outcomes of a ledger call, the value of the oncekit.outcome attribute of its
// metrics and spans.
const (
	// OutcomeFirst: the intent ran (or, for Claim, was claimed) for the first
	// time.
	OutcomeFirst = "first"
	// OutcomeReplay: a stored result or failure was returned and nothing ran.
	OutcomeReplay = "replay"
	// OutcomeFailed: a definitive failure was stored.
	OutcomeFailed = "failed"
	// OutcomeKeyReused: the key was used before with another fingerprint.
	OutcomeKeyReused = "key_reused"
	// OutcomeInProgress: another attempt held the key past the wait.
	OutcomeInProgress = "in_progress"
	// OutcomeSnapshotConflict: DoTx under REPEATABLE READ or SERIALIZABLE met a key
	// completed after its snapshot.
	OutcomeSnapshotConflict = "snapshot_conflict"
	// OutcomeRedrive: an external claim whose lease ran out was taken over; the call is
	// made again.
	OutcomeRedrive = "redrive"
	// OutcomeCompleted: an external call's result was stored under its lease.
	OutcomeCompleted = "completed"
	// OutcomeReleased: an external claim was given up.
	OutcomeReleased = "released"
	// OutcomeUncertain: an external call was reported as possibly made.
	OutcomeUncertain = "uncertain"
	// OutcomeLeaseLost: a finish was refused because another attempt took the key over.
	OutcomeLeaseLost = "lease_lost"
	// OutcomeError: anything else (a database error, a cancelled context).
	OutcomeError = "error"
)

// Attribute keys of the ledger's metrics and spans. Metrics carry the operation and the
// outcome only (the tenant and key would make too many series); spans carry the tenant
// and operation too, never the key's value or the body.
const (
	AttrOperation = "oncekit.operation"
	AttrOutcome   = "oncekit.outcome"
	AttrTenant    = "oncekit.tenant"
	AttrCall      = "oncekit.call"
)

// AttrLease is the attribute of the oncekit.ledger.pending gauge that says whether a
// pending record's lease is live or ran out ("live", "expired"): a pending record whose
// lease ran out is stuck until an attempt takes it over or an operator releases it.
const AttrLease = "oncekit.lease"

// telemetry holds the ledger's instruments; with no provider configured it records
// nothing and costs a branch.
type telemetry struct {
	metrics  bool
	calls    metric.Int64Counter
	duration metric.Float64Histogram
	wait     metric.Float64Histogram
	purged   metric.Int64Counter
	tracer   trace.Tracer
	log      *slog.Logger
}

// newTelemetry creates the instruments; pending counts the pending records for the
// gauge, at collection.
func newTelemetry(c *Config, pending func(context.Context) (live, expired int64, err error)) (*telemetry, error) {
	o := otelx.New(InstrumentationName, c.MeterProvider, c.TracerProvider, c.Logger)
	t := &telemetry{log: o.Log, tracer: o.Tracer}
	m := o.Meter
	if m == nil {
		return t, nil
	}
	in := otelx.Instruments{Meter: m}
	t.calls = in.Counter("oncekit.ledger.calls", "{call}",
		"Ledger calls, by operation and outcome (first, replay, key_reused, in_progress, redrive, ...).")
	t.duration = in.Histogram("oncekit.ledger.call.duration", "Duration of a ledger call, from its start to its commit or answer.")
	t.wait = in.Histogram("oncekit.ledger.wait.duration", "Time a call waited for another attempt holding its key.")
	t.purged = in.Counter("oncekit.ledger.purge.deleted", "{record}", "Expired records deleted by purges.")
	if in.Err != nil {
		return nil, in.Err
	}
	// Pending records are counted when the metrics are collected, from the partial index
	// of pending records: completed and failed records are not read.
	if _, err := m.Int64ObservableGauge("oncekit.ledger.pending", metric.WithUnit("{record}"),
		metric.WithDescription("Pending records of external calls, by lease (live, expired: stuck until taken over or released), counted at collection."),
		metric.WithInt64Callback(func(ctx context.Context, obs metric.Int64Observer) error {
			live, expired, err := pending(ctx)
			if err != nil {
				return err
			}
			obs.Observe(live, metric.WithAttributes(attribute.String(AttrLease, "live")))
			obs.Observe(expired, metric.WithAttributes(attribute.String(AttrLease, "expired")))
			return nil
		})); err != nil {
		return nil, err
	}
	t.metrics = true
	return t, nil
}

// call is one instrumented ledger call. It keeps the call's context, so that its
// metrics are recorded with the call's span as their exemplar.
type call struct {
	ctx   context.Context
	t     *telemetry
	name  string
	op    string
	start time.Time
	span  trace.Span
}

// begin starts a call's span (when tracing) and clock (when metering).
func (t *telemetry) begin(ctx context.Context, name string, scope keys.Scope) (context.Context, call) {
	c := call{t: t, name: name, op: scope.Operation}
	if t.metrics {
		c.start = time.Now()
	}
	if t.tracer != nil {
		ctx, c.span = t.tracer.Start(ctx, "oncekit.ledger."+name, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(attribute.String(AttrTenant, scope.Tenant), attribute.String(AttrOperation, scope.Operation)))
	}
	c.ctx = ctx
	return ctx, c
}

// end records the call's outcome.
func (c call) end(outcome string, err error) {
	if c.t.metrics {
		attrs := metric.WithAttributes(attribute.String(AttrOperation, c.op), attribute.String(AttrOutcome, outcome),
			attribute.String(AttrCall, c.name))
		// The call's context, even when cancelled: it carries the span the exemplars
		// point to.
		c.t.calls.Add(c.ctx, 1, attrs)
		c.t.duration.Record(c.ctx, time.Since(c.start).Seconds(), attrs)
	}
	if c.span != nil {
		c.span.SetAttributes(attribute.String(AttrOutcome, outcome))
		if outcome == OutcomeError {
			c.span.RecordError(err)
			c.span.SetStatus(codes.Error, err.Error())
		}
		c.span.End()
	}
}

// waited records a wait for another attempt.
func (t *telemetry) waited(ctx context.Context, op string, d time.Duration) {
	if t.metrics && d > 0 {
		t.wait.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String(AttrOperation, op)))
	}
}

// OutcomeOf classifies what Do, DoTx or Claim returned as one of the Outcome values, as
// the ledger's own metrics do; package activity reports its calls with it.
func OutcomeOf(res Result, err error) string { return doOutcome(res, err) }

// doOutcome classifies the end of Do, DoTx and Claim.
func doOutcome(res Result, err error) string {
	var derr *DefinitiveError
	switch {
	case err == nil && res.Replayed:
		return OutcomeReplay
	case err == nil:
		return OutcomeFirst
	case errors.As(err, &derr):
		if derr.Replayed {
			return OutcomeReplay
		}
		return OutcomeFailed
	case errors.Is(err, ErrFingerprintMismatch):
		return OutcomeKeyReused
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrSnapshotConflict):
		return OutcomeSnapshotConflict
	}
	return OutcomeError
}

// finishOutcome classifies the end of Complete, Fail, Release and MarkUncertain.
func finishOutcome(ok string, err error) string {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, ErrLeaseLost):
		return OutcomeLeaseLost
	}
	return OutcomeError
}

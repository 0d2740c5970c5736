package activity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
)

// WaitDefault is how long an attempt waits, heartbeating, for another attempt that holds
// its key before it fails with a retryable [policy.ErrTypeInProgress].
const WaitDefault = 30 * time.Second

// PurposeDefault is the purpose the downstream key of [External] is derived with.
const PurposeDefault = "downstream"

// Opts are per-call options of [Do], [DoErr], [External], [ExternalErr] and
// [StepResult]. A nil *Opts, or the zero Opts, means all defaults. A value no retry can
// fix (no ledger, no tenant, an invalid tenant, operation, key or purpose) fails the call
// with a non-retryable ApplicationError of type [policy.ErrTypeInvalid] whose message
// says what to set, before anything runs.
type Opts struct {
	// Ledger is the ledger to record in. Defaults to the one oncekit's worker plugin put in
	// the activity's context (see package worker); with neither, the call fails with
	// policy.ErrTypeInvalid ("no ledger").
	Ledger *ledger.Ledger
	// Tenant scopes the key. Defaults to the tenant propagated from the workflow (see
	// [keys.WithTenant]), then to the worker's default tenant; with none of them, the call
	// fails with policy.ErrTypeInvalid ("no tenant"). A tenant keys.Scope refuses (over
	// keys.MaxScopeLen bytes, or a byte outside printable ASCII) fails the same way.
	Tenant string
	// Operation names what the activity does, such as "payments.charge"; it scopes the
	// key. Defaults to the activity's type name, the name Temporal registered it under
	// (a function's name, a registered struct's method name, or the Name of Temporal's
	// activity.RegisterOptions): keep that name stable, since renaming it changes every
	// key. An operation keys.Scope refuses fails the call with policy.ErrTypeInvalid.
	Operation string
	// Strategy chooses the key from the activity's identity. Defaults to
	// [keys.RunScoped] (the zero Strategy). Ignored when Key is set, or when the workflow
	// handed the activity a key; otherwise keys.BusinessScoped, which names no identity,
	// fails the call with policy.ErrTypeInvalid.
	Strategy keys.Strategy
	// Key is an explicit business key, such as the one keys.Business(orderID, "charge")
	// returns; it survives workflow resets. Defaults to the key the workflow handed this
	// activity call (keys.KeyContextKey, as package saga does), then to the key of
	// Strategy. An invalid key (empty is the default, not an error; over the ledger's
	// MaxKeyLen, or a byte outside printable ASCII) fails the call with
	// policy.ErrTypeInvalid.
	Key keys.Key
	// Wait bounds how long the attempt waits, heartbeating, for another attempt holding
	// the key. Defaults to [WaitDefault]; ledger.NoWait (any negative value) fails fast.
	Wait time.Duration
	// Purpose derives [Call].DownstreamKey. Defaults to [PurposeDefault]. A purpose
	// keys.DeriveIn refuses (over keys.MaxPurposeLen bytes, or a byte other than letters,
	// digits, '-', '_' and '.') fails the call with policy.ErrTypeInvalid.
	Purpose string
}

// Definitive returns a business failure that Temporal does not retry: the workflow sees
// a non-retryable ApplicationError whose type is code and whose message is the error's
// text ("code: message"). Returned from the function of [Do] or [External] it is also stored, and
// every retry of the key gets it back (Details: code, message, and whether it was
// replayed). Returned from any other activity on a worker with oncekit's plugin (or
// worker.Interceptor) it becomes the same error, unstored; on a worker without either,
// Temporal sees a plain retryable error. code is required in practice: a stable,
// machine-readable name such as "card_declined", which retry policies and workflow code
// match; an empty code is not refused, but leaves nothing to match.
func Definitive(code, message string) error { return ledger.Definitive(code, message) }

// NotApplied marks err as one after which an external call certainly had no effect (the
// provider refused the request before doing anything): [External] releases the key, and
// the retry makes the call afresh. It returns a *ledger.NotAppliedError, which tests can
// errors.As, or nil for a nil err.
func NotApplied(err error) error { return ledger.NotApplied(err) }

type ledgerKey struct{}

// WithLedger returns a copy of ctx carrying l for [Do] and [External]. oncekit's worker plugin
// does this for every activity it runs. A nil l leaves the activities without a ledger.
func WithLedger(ctx context.Context, l *ledger.Ledger) context.Context {
	return context.WithValue(ctx, ledgerKey{}, l)
}

// LedgerFrom returns the ledger carried by ctx, or nil when it carries none.
func LedgerFrom(ctx context.Context) *ledger.Ledger {
	l, _ := ctx.Value(ledgerKey{}).(*ledger.Ledger)
	return l
}

// guard is what Do and External share: the resolved ledger, intent and options.
type guard struct {
	l       *ledger.Ledger
	in      ledger.Intent
	info    tactivity.Info
	wait    time.Duration
	purpose string
	// derived is set when the key comes from this activity execution's identity, so
	// that no other activity shares it.
	derived bool
}

func newGuard(ctx context.Context, req any, opts *Opts) (*guard, error) {
	o := Opts{}
	if opts != nil {
		o = *opts
	}
	g, err := resolve(ctx, o)
	if err != nil {
		return nil, err
	}
	key := o.Key
	if key == "" {
		key, _ = keys.KeyFrom(ctx)
	}
	g.derived = key == ""
	if g.derived {
		if key, err = KeyFor(ctx, o.Strategy); err != nil {
			return nil, invalid(err)
		}
	}
	fp, err := keys.FingerprintJSON(req)
	if err != nil {
		return nil, invalid(err)
	}
	g.in.Key, g.in.Fingerprint = key, fp
	return g, nil
}

// resolve finds what every guard needs from the activity's context and o: the ledger,
// the scope and the waiting options. The key and fingerprint are left to the caller.
func resolve(ctx context.Context, o Opts) (*guard, error) {
	if !tactivity.IsActivity(ctx) {
		return nil, invalid(ErrNotActivity)
	}
	info := tactivity.GetInfo(ctx)
	l := o.Ledger
	if l == nil {
		l = LedgerFrom(ctx)
	}
	if l == nil {
		return nil, invalid(errors.New("oncekit/activity: no ledger: run the activity on a worker with oncekit's plugin (worker.NewPlugin), or set Opts.Ledger"))
	}
	tenant := o.Tenant
	if tenant == "" {
		tenant, _ = keys.TenantFrom(ctx)
	}
	if tenant == "" {
		return nil, invalid(errors.New("oncekit/activity: no tenant: start the workflow with keys.WithTenant through an oncekit client, set the worker's DefaultTenant, or set Opts.Tenant"))
	}
	op := o.Operation
	if op == "" {
		op = info.ActivityType.Name
	}
	g := &guard{l: l, info: info, wait: o.Wait, purpose: o.Purpose,
		in: ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}}}
	if g.wait == 0 {
		g.wait = WaitDefault
	}
	if g.purpose == "" {
		g.purpose = PurposeDefault
	}
	return g, nil
}

// withOrigin returns ctx carrying the activity's [ledger.Origin], unless it carries one
// (oncekit's worker plugin puts it there), so that the records a guarded call writes
// name their workflow, run and activity type on a worker built without the plugin too.
func (g *guard) withOrigin(ctx context.Context) context.Context {
	if _, ok := ledger.OriginFrom(ctx); ok {
		return ctx
	}
	o := ledger.Origin{WorkflowID: g.info.WorkflowExecution.ID, RunID: g.info.WorkflowExecution.RunID, ActivityType: g.info.ActivityType.Name}
	if g.info.WorkflowType != nil {
		o.WorkflowType = g.info.WorkflowType.Name
	}
	return ledger.WithOrigin(ctx, o)
}

// MetricCalls is the counter package activity adds to through Temporal's metrics handler
// (activity.GetMetricsHandler), so the SDK's own Prometheus or OpenTelemetry setup shows
// it beside the workflow type and task queue: one per guarded call, tagged with
// oncekit_operation and oncekit_outcome (the ledger's Outcome values: first, replay,
// key_reused, in_progress, failed, redrive, ...). It counts what the ledger's
// oncekit.ledger.calls counts for activities, with no MeterProvider to configure and with
// Temporal's tags; Temporal's handler takes no unit, so it has none.
const MetricCalls = "oncekit_activity_calls"

// report counts a guarded call through Temporal's metrics handler.
func (g *guard) report(ctx context.Context, outcome string) {
	tactivity.GetMetricsHandler(ctx).WithTags(map[string]string{
		"oncekit_operation": g.in.Scope.Operation, "oncekit_outcome": outcome,
	}).Counter(MetricCalls).Inc(1)
}

// waitSlice is the longest single wait between two heartbeats of a waiting attempt (half
// the heartbeat timeout when that is shorter).
const waitSlice = 5 * time.Second

// waitLoop calls try with bounded waits, heartbeating between them, until try returns
// something other than ErrInProgress or the attempt's wait is used up.
func (g *guard) waitLoop(ctx context.Context, try func(wait time.Duration) error) error {
	if g.wait < 0 {
		return try(0)
	}
	slice := waitSlice
	if hb := g.info.HeartbeatTimeout; hb > 0 {
		slice = min(slice, hb/2)
	}
	deadline := time.Now().Add(g.wait)
	if d := g.info.Deadline; !d.IsZero() && d.Add(-time.Second).Before(deadline) {
		// Answer before the attempt times out, so the retry is scheduled at once.
		deadline = d.Add(-time.Second)
	}
	for {
		left := time.Until(deadline)
		err := try(max(min(slice, left), 0))
		if !errors.Is(err, ledger.ErrInProgress) || left <= slice {
			return err
		}
		tactivity.RecordHeartbeat(ctx, "oncekit: waiting for another attempt with key "+string(g.in.Key))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func decode[Resp any](body []byte) (Resp, error) {
	var r Resp
	if len(body) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return r, invalid(fmt.Errorf("oncekit/activity: stored result does not decode as %T: %w", r, err))
	}
	return r, nil
}

// errNilFunc is the error of a nil side effect.
var errNilFunc = errors.New("oncekit/activity: nil function: pass the side effect to run")

// invalid marks an error no retry can fix. The error's text becomes the message and is
// not repeated as a cause, so it appears once in the workflow's error.
func invalid(err error) error {
	return temporal.NewApplicationErrorWithOptions(err.Error(), policy.ErrTypeInvalid, temporal.ApplicationErrorOptions{NonRetryable: true})
}

// toTemporal maps ledger outcomes to Temporal errors; other errors pass through.
func toTemporal(err error) error {
	if err == nil {
		return nil
	}
	var (
		derr *ledger.DefinitiveError
		mm   *ledger.FingerprintMismatchError
		ve   *keys.ValidationError
	)
	switch {
	case errors.As(err, &derr):
		return temporal.NewApplicationErrorWithOptions(derr.Error(), derr.Code, temporal.ApplicationErrorOptions{
			NonRetryable: true, Details: []any{derr.Code, derr.Message, derr.Replayed}})
	case errors.As(err, &mm):
		return temporal.NewApplicationErrorWithOptions(mm.Error(), policy.ErrTypeKeyReused, temporal.ApplicationErrorOptions{
			NonRetryable: true, Details: []any{string(mm.Key), mm.Scope.Tenant, mm.Scope.Operation}})
	case errors.Is(err, ledger.ErrInProgress):
		return temporal.NewApplicationError(err.Error(), policy.ErrTypeInProgress)
	case errors.Is(err, ledger.ErrLeaseLost):
		return temporal.NewApplicationError(err.Error(), policy.ErrTypeLeaseLost)
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		return temporal.NewApplicationError(err.Error(), policy.ErrTypeOutcomeUnknown)
	case errors.As(err, &ve), errors.Is(err, ledger.ErrBodyTooLarge), errors.Is(err, ledger.ErrManagedTx):
		return invalid(err)
	}
	return err
}

package activity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	tactivity "go.temporal.io/sdk/activity"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
)

// Registry is where activities are registered: a Temporal worker, or Temporal's test
// environments.
type Registry interface {
	RegisterActivityWithOptions(a any, options tactivity.RegisterOptions)
}

// RegisterSaga registers the activities that package saga records outcomes with
// ([saga.ActivityBegin] and [saga.ActivityEnd]) on r. worker.NewPlugin and the testsuite
// environments do this; a worker built by hand calls it once.
func RegisterSaga(r Registry) {
	r.RegisterActivityWithOptions(sagaBegin, tactivity.RegisterOptions{Name: saga.ActivityBegin})
	r.RegisterActivityWithOptions(sagaEnd, tactivity.RegisterOptions{Name: saga.ActivityEnd})
}

func sagaGuard(ctx context.Context, req saga.BeginRequest) (*guard, error) {
	g, err := resolve(ctx, Opts{Operation: saga.Operation})
	if err != nil {
		return nil, err
	}
	g.in.Key, g.in.Fingerprint = req.Key, req.Fingerprint
	return g, nil
}

// claimSaga claims the saga's key with the run's token: a fresh key or the run's own
// claim yields a lease, an ended saga its outcome, and another run in flight a wait.
func claimSaga(ctx context.Context, g *guard, req saga.BeginRequest) (*ledger.Lease, saga.Recorded, error) {
	var claim ledger.ClaimResult
	err := g.waitLoop(ctx, func(wait time.Duration) (err error) {
		claim, err = g.l.Claim(ctx, g.in, &ledger.ClaimOpts{Wait: wait, Lease: req.Lease, Token: req.Token})
		return err
	})
	var derr *ledger.DefinitiveError
	switch {
	case errors.As(err, &derr):
		return nil, saga.Recorded{Ended: true, ErrType: derr.Code, ErrMessage: derr.Message}, nil
	case err != nil:
		return nil, saga.Recorded{}, toTemporal(err)
	case claim.Lease == nil:
		return nil, saga.Recorded{Ended: true, Result: claim.Result.Body}, nil
	}
	return claim.Lease, saga.Recorded{}, nil
}

func sagaBegin(ctx context.Context, req saga.BeginRequest) (saga.Recorded, error) {
	g, err := sagaGuard(ctx, req)
	if err != nil {
		return saga.Recorded{}, err
	}
	_, rec, err := claimSaga(ctx, g, req)
	return rec, err
}

func sagaEnd(ctx context.Context, req saga.EndRequest) error {
	g, err := sagaGuard(ctx, req.BeginRequest)
	if err != nil {
		return err
	}
	lease, _, err := claimSaga(ctx, g, req.BeginRequest)
	if err != nil || lease == nil {
		return err // nil when already recorded: an earlier attempt of this End committed
	}
	out := req.Outcome
	if out.ErrType != "" {
		err = g.l.Fail(ctx, lease, ledger.Definitive(out.ErrType, out.ErrMessage))
	} else {
		_, err = g.l.Complete(ctx, lease, ledger.Response{Body: out.Result})
	}
	return toTemporal(err)
}

// StepState is what the ledger holds for the saga step a compensation undoes.
type StepState int

const (
	// StepNotRun: nothing is recorded; the step never took effect and there is nothing
	// to undo.
	StepNotRun StepState = iota
	// StepPending: an external step claimed its key and did not finish. Its call may have
	// reached the provider: undo by [StepRecord].DownstreamKey, or treat a provider's "no
	// such charge" as nothing to undo.
	StepPending
	// StepCompleted: the step's result is stored and decoded into StepResult's out.
	StepCompleted
	// StepFailed: the step stored a definitive failure; it had no effect to undo.
	StepFailed
)

func (s StepState) String() string {
	switch s {
	case StepNotRun:
		return "not run"
	case StepPending:
		return "pending"
	case StepCompleted:
		return "completed"
	case StepFailed:
		return "failed"
	}
	return "StepState(?)"
}

// StepRecord is what a compensation learns about the step it undoes.
type StepRecord struct {
	// Key is the step's key.
	Key keys.Key
	// DownstreamKey is the key [External] sent the provider for the step (derived with
	// Opts.Purpose), for a refund that names the charge by its idempotency key.
	DownstreamKey keys.Key
	State         StepState
	// Uncertain is set when an attempt of a pending step reported that its call may have
	// happened.
	Uncertain bool
}

// StepResult reads, from a saga compensation, the record of the step it undoes (package
// saga hands the compensation its step's key), and decodes the step's stored result into
// out (a pointer, or nil) when the step completed. The compensation can then undo by the
// step's result, such as a charge ID, and return early when there is nothing to undo:
//
//	rec, err := activity.StepResult(ctx, &charge, nil)
//	if err != nil {
//		return err
//	}
//	if rec.State == activity.StepNotRun || rec.State == activity.StepFailed {
//		return nil // nothing to undo
//	}
//
// The step's operation is its activity's registered name, as saga passes it; set
// Opts.Operation when the step named its activity by function. Opts.Key, Strategy and
// Wait do not apply.
func StepResult(ctx context.Context, out any, opts *Opts) (StepRecord, error) {
	o := Opts{}
	if opts != nil {
		o = *opts
	}
	step, ok := keys.StepFrom(ctx)
	if !ok {
		return StepRecord{}, invalid(errors.New("oncekit/activity: StepResult: this activity is not a saga compensation: its context carries no step"))
	}
	if o.Operation == "" {
		o.Operation = step.Operation
	}
	if o.Operation == "" {
		return StepRecord{}, invalid(errors.New("oncekit/activity: StepResult: the step named its activity by function: set Opts.Operation to the step's operation"))
	}
	g, err := resolve(ctx, o)
	if err != nil {
		return StepRecord{}, err
	}
	rec := StepRecord{Key: step.Key}
	if rec.DownstreamKey, err = keys.DeriveIn(g.in.Scope, step.Key, g.purpose); err != nil {
		return StepRecord{}, invalid(err)
	}
	r, err := g.l.Get(ctx, g.in.Scope, step.Key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return rec, nil
	case err != nil:
		return StepRecord{}, toTemporal(err)
	}
	switch r.State {
	case ledger.StatePending:
		rec.State, rec.Uncertain = StepPending, r.Uncertain
	case ledger.StateFailed:
		rec.State = StepFailed
	case ledger.StateCompleted:
		rec.State = StepCompleted
		if out != nil && len(r.Response.Body) > 0 {
			if err := json.Unmarshal(r.Response.Body, out); err != nil {
				return StepRecord{}, invalid(fmt.Errorf("oncekit/activity: the step's stored result does not decode as %T: %w", out, err))
			}
		}
	}
	return rec, nil
}

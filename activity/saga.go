package activity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	tactivity "go.temporal.io/sdk/activity"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/sagarec"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
)

// Registry is where activities are registered: a Temporal worker, or Temporal's test
// environments.
type Registry interface {
	RegisterActivityWithOptions(a any, options tactivity.RegisterOptions)
}

// RegisterSaga registers the activities that package saga records sagas with
// ([sagarec.ActivityBegin], [sagarec.ActivityHold], [sagarec.ActivityCompensating] and
// [sagarec.ActivityEnd]) on r. worker.NewPlugin and the testsuite environments do this; a
// worker built by hand calls it once.
func RegisterSaga(r Registry) {
	r.RegisterActivityWithOptions(sagaBegin, tactivity.RegisterOptions{Name: sagarec.ActivityBegin})
	r.RegisterActivityWithOptions(sagaHold, tactivity.RegisterOptions{Name: sagarec.ActivityHold})
	r.RegisterActivityWithOptions(sagaCompensating, tactivity.RegisterOptions{Name: sagarec.ActivityCompensating})
	r.RegisterActivityWithOptions(sagaEnd, tactivity.RegisterOptions{Name: sagarec.ActivityEnd})
}

func sagaGuard(ctx context.Context, req sagarec.BeginRequest) (*guard, error) {
	g, err := resolve(ctx, Opts{Operation: saga.Operation})
	if err != nil {
		return nil, err
	}
	g.in.Key, g.in.Fingerprint = keys.Key(req.Key), keys.Fingerprint(req.Fingerprint)
	return g, nil
}

// claimSaga claims the saga's key with the run's token: a fresh key or the run's own
// claim yields a lease, an ended saga its outcome, and another run in flight a wait
// (then a ledger.ErrInProgress).
func claimSaga(ctx context.Context, g *guard, req sagarec.BeginRequest) (*ledger.Lease, sagarec.Recorded, error) {
	var claim ledger.ClaimResult
	err := g.waitLoop(ctx, func(wait time.Duration) (err error) {
		claim, err = g.l.Claim(g.withOrigin(ctx), g.in, &ledger.ClaimOpts{Wait: wait, Lease: req.Lease, Token: req.Token})
		return err
	})
	var derr *ledger.DefinitiveError
	switch {
	case errors.As(err, &derr):
		rec, err := endedWithError(ctx, g, nil, req, derr.Code, derr.Message)
		return nil, rec, err
	case err != nil:
		return nil, sagarec.Recorded{}, err
	case claim.Lease == nil:
		return nil, sagarec.Recorded{Ended: true, Result: claim.Result.Body}, nil
	}
	return claim.Lease, sagarec.Recorded{}, nil
}

// sagaBegin claims the key, or returns its outcome. As a local activity it does not
// wait for another run in flight: it answers Held, and the workflow waits through the
// activity.
func sagaBegin(ctx context.Context, req sagarec.BeginRequest) (sagarec.Recorded, error) {
	g, err := sagaGuard(ctx, req)
	if err != nil {
		return sagarec.Recorded{}, err
	}
	local := g.info.IsLocalActivity
	if local {
		g.wait = ledger.NoWait
	}
	lease, rec, err := claimSaga(ctx, g, req)
	switch {
	case local && errors.Is(err, ledger.ErrInProgress):
		return sagarec.Recorded{Held: true}, nil
	case err != nil:
		return sagarec.Recorded{}, toTemporal(err)
	case lease == nil:
		return rec, nil
	}
	rec.Compensating, err = readCompensating(ctx, g, nil, req)
	return rec, err
}

// sagaHold renews the run's lease and reports what the key holds.
func sagaHold(ctx context.Context, req sagarec.BeginRequest) (sagarec.Recorded, error) {
	g, err := sagaGuard(ctx, req)
	if err != nil {
		return sagarec.Recorded{}, err
	}
	if err := g.l.Extend(ctx, sagaLease(g, req), req.Lease); err != nil {
		return notHeld(ctx, g, nil, req, err)
	}
	var rec sagarec.Recorded
	rec.Compensating, err = readCompensating(ctx, g, nil, req)
	return rec, err
}

// sagaCompensating records that the saga is compensating, unless a run of it did first,
// and returns the record in effect. The saga's row is locked meanwhile (by renewing its
// lease in the same transaction), so that End cannot record a success beside it.
func sagaCompensating(ctx context.Context, req sagarec.CompensatingRequest) (sagarec.Recorded, error) {
	g, err := sagaGuard(ctx, req.BeginRequest)
	if err != nil {
		return sagarec.Recorded{}, err
	}
	body, err := json.Marshal(req.Compensating)
	if err != nil {
		return sagarec.Recorded{}, invalid(err)
	}
	var rec sagarec.Recorded
	err = inTx(ctx, g, func(tx pgx.Tx) error {
		if err := g.l.ExtendTx(ctx, tx, sagaLease(g, req.BeginRequest), req.Lease); err != nil {
			rec, err = notHeld(ctx, g, tx, req.BeginRequest, err)
			return err
		}
		if rec.Compensating, err = readCompensating(ctx, g, tx, req.BeginRequest); err != nil || rec.Compensating != nil {
			return err
		}
		key, err := compensatingKey(req.BeginRequest)
		if err != nil {
			return err
		}
		claim, err := g.l.ClaimTx(g.withOrigin(ctx), tx, ledger.Intent{Scope: g.in.Scope, Key: key, Fingerprint: keys.Fingerprint(req.Fingerprint)},
			&ledger.ClaimOpts{Token: req.Token, Lease: req.Lease})
		if err != nil {
			return toTemporal(err)
		}
		if claim.Lease == nil { // recorded meanwhile, which the lock rules out; read it
			rec.Compensating, err = decodeCompensating(claim.Result.Body)
			return err
		}
		if _, err := g.l.CompleteTx(ctx, tx, claim.Lease, ledger.Response{Body: body}); err != nil {
			return toTemporal(err)
		}
		c := req.Compensating
		rec.Compensating = &c
		return nil
	})
	return rec, err
}

// sagaEnd records the saga's outcome, and returns what the key holds: the outcome (this
// one, or one recorded before), or, for a success, that a run of the saga began
// compensating, in which case nothing is recorded and the saga must compensate.
func sagaEnd(ctx context.Context, req sagarec.EndRequest) (sagarec.Recorded, error) {
	g, err := sagaGuard(ctx, req.BeginRequest)
	if err != nil {
		return sagarec.Recorded{}, err
	}
	lease, rec, err := claimSaga(ctx, g, req.BeginRequest)
	if err != nil {
		return sagarec.Recorded{}, toTemporal(err)
	}
	if lease == nil {
		return rec, nil // recorded already: by an earlier attempt of this End, or another run
	}
	out := req.Outcome
	out.Ended, out.Held, out.Compensating = true, false, nil
	err = inTx(ctx, g, func(tx pgx.Tx) error {
		if err := g.l.ExtendTx(ctx, tx, lease, req.Lease); err != nil {
			out, err = notHeld(ctx, g, tx, req.BeginRequest, err)
			return err
		}
		if out.ErrType == "" {
			c, err := readCompensating(ctx, g, tx, req.BeginRequest)
			if err != nil || c != nil {
				out = sagarec.Recorded{Compensating: c}
				return err
			}
			_, err = g.l.CompleteTx(ctx, tx, lease, ledger.Response{Body: out.Result})
			return toTemporal(err)
		}
		return toTemporal(g.l.FailTx(ctx, tx, lease, ledger.Definitive(out.ErrType, out.ErrMessage)))
	})
	return out, err
}

// sagaLease is the run's lease on the saga's key, as its token names it.
func sagaLease(g *guard, req sagarec.BeginRequest) *ledger.Lease {
	return &ledger.Lease{Intent: g.in, Token: req.Token}
}

// notHeld turns a lease the run no longer holds into what the key holds now: the
// recorded outcome, or another run's claim; through tx when it is set.
func notHeld(ctx context.Context, g *guard, tx pgx.Tx, req sagarec.BeginRequest, err error) (sagarec.Recorded, error) {
	var lost *ledger.LeaseLostError
	if !errors.As(err, &lost) {
		return sagarec.Recorded{}, toTemporal(err)
	}
	cur := lost.Current
	switch {
	case cur == nil || cur.Expired || cur.State == ledger.StatePending:
		return sagarec.Recorded{Held: true}, nil
	case cur.State == ledger.StateFailed:
		return endedWithError(ctx, g, tx, req, cur.ErrorCode, cur.ErrorMessage)
	}
	return sagarec.Recorded{Ended: true, Result: cur.Response.Body}, nil
}

// endedWithError is a saga recorded as failed, with the record it compensated under,
// whose cause the replayed error carries; through tx when it is set.
func endedWithError(ctx context.Context, g *guard, tx pgx.Tx, req sagarec.BeginRequest, code, msg string) (sagarec.Recorded, error) {
	c, err := readCompensating(ctx, g, tx, req)
	if err != nil {
		return sagarec.Recorded{}, err
	}
	return sagarec.Recorded{Ended: true, ErrType: code, ErrMessage: msg, Compensating: c}, nil
}

func compensatingKey(req sagarec.BeginRequest) (keys.Key, error) {
	k, err := keys.Derive(keys.Key(req.Key), sagarec.CompensatingPurpose)
	if err != nil {
		return "", invalid(err)
	}
	return k, nil
}

// readCompensating returns the record that the saga began compensating, or nil; through
// tx when it is set.
func readCompensating(ctx context.Context, g *guard, tx pgx.Tx, req sagarec.BeginRequest) (*sagarec.Compensating, error) {
	key, err := compensatingKey(req)
	if err != nil {
		return nil, err
	}
	var r *ledger.Record
	if tx != nil {
		r, err = g.l.GetTx(ctx, tx, g.in.Scope, key)
	} else {
		r, err = g.l.Get(ctx, g.in.Scope, key)
	}
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, toTemporal(err)
	case r.State != ledger.StateCompleted:
		return nil, nil
	}
	return decodeCompensating(r.Response.Body)
}

func decodeCompensating(body []byte) (*sagarec.Compensating, error) {
	var c sagarec.Compensating
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, invalid(fmt.Errorf("oncekit/activity: the saga's compensating record does not decode: %w", err))
	}
	return &c, nil
}

// inTx runs fn in a transaction on the pool of the saga's tenant and commits it when fn
// returns nil.
func inTx(ctx context.Context, g *guard, fn func(tx pgx.Tx) error) error {
	pool, err := g.l.Router().Pool(g.in.Scope.Tenant)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); pgsql.CommitUnknown(err) {
		// The saga's record may have committed: a retry reads it, never a rollback.
		return toTemporal(&ledger.OutcomeUnknownError{Scope: g.in.Scope, Key: g.in.Key, Err: err})
	} else if err != nil {
		return err
	}
	return nil
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
// The step's operation is the name its activity ran under, which package saga and
// oncekit's worker interceptor pass along, whether the step named its activity by
// registered name or by function. Set Opts.Operation when the step's activity records
// under another operation (its own Opts.Operation). Opts.Key, Strategy and Wait do not
// apply.
//
// Called from an activity that is not a saga compensation (its context carries no
// step), StepResult fails with a non-retryable ApplicationError of type
// policy.ErrTypeInvalid, as it does when the stored result does not decode into out.
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
		return StepRecord{}, invalid(errors.New("oncekit/activity: StepResult: the compensation was not told its step's operation: " +
			"run the workflow on a worker with oncekit's plugin (worker.NewPlugin), or set Opts.Operation to the operation the step records under"))
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

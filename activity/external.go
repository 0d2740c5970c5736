package activity

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Call describes one attempt at a guarded side effect: what [External]'s and [Do]'s
// callbacks get.
type Call struct {
	// Key is the activity's key.
	Key keys.Key
	// DownstreamKey is derived from Key and its scope (see keys.DeriveIn): send it as the
	// provider's idempotency key, so the provider deduplicates a call that this or an
	// earlier attempt already made.
	DownstreamKey keys.Key
	// Attempt counts the attempts that claimed this key, this one included. In Do, it is
	// the activity's attempt number.
	Attempt int
	// Redrive is true when an earlier attempt claimed the key and did not finish: the call
	// may have reached the provider already. Always false in Do, whose effect commits
	// with its record.
	Redrive bool
	// Uncertain is true when an earlier attempt reported that its call may have happened.
	// Always false in Do.
	Uncertain bool
}

// CallFunc makes an external call for req and returns the activity's result.
//
// Return [Definitive] for a business failure the provider answered definitively (a
// declined card): it is stored and replayed. Return [NotApplied] when the provider
// certainly did not act (it refused the request before doing anything): the key is
// released. Any other error means the call may have happened: the attempt records that,
// and the retry repeats the call with the same downstream key.
type CallFunc[Req, Resp any] func(ctx context.Context, call Call, req Req) (Resp, error)

// External runs call at most once per activity intent as far as the provider can tell:
// it claims the key before the call with a lease that lasts until the attempt's
// deadline, and stores the outcome after it. A retry after a crash re-drives the call with
// the same [Call].DownstreamKey; a retry after completion returns the stored result and
// does not call.
//
// Called outside an activity or with a nil call, External fails with a non-retryable
// ApplicationError of type policy.ErrTypeInvalid; [Opts] says which options fail the
// same way.
func External[Req, Resp any](ctx context.Context, req Req, call CallFunc[Req, Resp], opts *Opts) (Resp, error) {
	var zero Resp
	if call == nil {
		return zero, invalid(errNilFunc)
	}
	g, err := newGuard(ctx, req, opts)
	if err != nil {
		return zero, err
	}
	var claim ledger.ClaimResult
	err = g.waitLoop(ctx, func(wait time.Duration) error {
		claim, err = g.l.Claim(g.withOrigin(ctx), g.in, &ledger.ClaimOpts{Wait: wait, Lease: g.lease()})
		return err
	})
	outcome := ledger.OutcomeOf(claim.Result, err)
	if claim.Lease != nil && claim.Lease.Redrive {
		outcome = ledger.OutcomeRedrive
	}
	g.report(ctx, outcome)
	if err != nil {
		return zero, toTemporal(err)
	}
	if claim.Lease == nil {
		return decode[Resp](claim.Result.Body)
	}
	lease := claim.Lease
	c, err := g.call(lease.Attempt)
	if err != nil {
		return zero, err
	}
	c.Redrive, c.Uncertain = lease.Redrive, lease.Uncertain
	out, callErr := call(ctx, c, req)
	// Record the outcome even if the attempt's context ended meanwhile.
	rctx := context.WithoutCancel(ctx)
	switch faultpoint.At(ctx, faultpoint.AfterCall, out, callErr) {
	case faultpoint.Crash:
		// A test's fault plan: the attempt dies before it records anything, and its lease
		// runs out as by the deadline of a lost attempt, so the retry takes the key over.
		_ = g.l.Extend(rctx, lease, time.Millisecond)
		return zero, faultpoint.ErrCrashed
	case faultpoint.LoseAnswer:
		if callErr == nil {
			out, callErr = zero, faultpoint.ErrLostAnswer
		}
	}
	var derr *ledger.DefinitiveError
	var na *ledger.NotAppliedError
	switch {
	case callErr == nil:
		body, err := json.Marshal(out)
		if err != nil {
			_ = g.l.MarkUncertain(rctx, lease)
			return zero, invalid(err)
		}
		if _, err := g.l.Complete(rctx, lease, ledger.Response{Body: body}); err != nil {
			return zero, toTemporal(err)
		}
		return out, nil
	case errors.As(callErr, &derr):
		if err := g.l.Fail(rctx, lease, derr); err != nil {
			return zero, toTemporal(err)
		}
		return zero, toTemporal(derr)
	case errors.As(callErr, &na):
		if err := g.l.Release(rctx, lease); err != nil {
			return zero, errors.Join(callErr, toTemporal(err))
		}
		return zero, callErr
	default:
		if err := g.l.MarkUncertain(rctx, lease); err != nil {
			return zero, errors.Join(callErr, toTemporal(err))
		}
		return zero, callErr
	}
}

// call describes this attempt: the key, and the downstream key derived from it.
func (g *guard) call(attempt int) (Call, error) {
	downstream, err := keys.DeriveIn(g.in.Scope, g.in.Key, g.purpose)
	if err != nil {
		return Call{}, invalid(err)
	}
	return Call{Key: g.in.Key, DownstreamKey: downstream, Attempt: attempt}, nil
}

// lease lasts until the attempt's deadline: by then Temporal has given up on the attempt
// and scheduled a retry, which must be able to take the key over.
func (g *guard) lease() time.Duration {
	if g.info.Deadline.IsZero() {
		return 0 // the ledger's default
	}
	if d := time.Until(g.info.Deadline); d > time.Second {
		return d
	}
	return time.Second
}

// ExternalErr is [External] for an activity that returns only an error: call runs at
// most once per activity intent as far as the provider can tell, and a retry after its
// outcome was recorded returns nil (or the stored [Definitive] failure) without calling.
func ExternalErr[Req any](ctx context.Context, req Req, call func(ctx context.Context, call Call, req Req) error, opts *Opts) error {
	if call == nil {
		return invalid(errNilFunc)
	}
	_, err := External(ctx, req, func(ctx context.Context, c Call, req Req) (struct{}, error) {
		return struct{}{}, call(ctx, c, req)
	}, opts)
	return err
}

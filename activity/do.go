package activity

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// Func is a local side effect: it writes through tx, in the ledger's transaction, and
// returns the activity's result. call carries the activity's key, for rows that want to
// record it, as [External]'s callback gets it. Returning [Definitive] stores the failure;
// any other error rolls back and lets Temporal retry.
type Func[Req, Resp any] func(ctx context.Context, tx pgx.Tx, call Call, req Req) (Resp, error)

// Do runs fn once per activity intent and returns its result; a retried attempt of an
// activity whose earlier attempt committed gets the stored result and fn does not run.
// The result is stored as JSON, so a replay decodes to a value equal to the first.
//
// Called outside an activity, with a nil fn, or with a result that does not encode as
// JSON, Do fails with a non-retryable ApplicationError of type policy.ErrTypeInvalid;
// [Opts] says which options fail the same way. The package documentation lists how the
// ledger's other outcomes reach the workflow.
func Do[Req, Resp any](ctx context.Context, req Req, fn Func[Req, Resp], opts *Opts) (Resp, error) {
	var zero Resp
	if fn == nil {
		return zero, invalid(errNilFunc)
	}
	g, err := newGuard(ctx, req, opts)
	if err != nil {
		return zero, err
	}
	call, err := g.call(int(g.info.Attempt))
	if err != nil {
		return zero, err
	}
	var res ledger.Result
	err = g.waitLoop(ctx, func(wait time.Duration) error {
		res, err = g.l.Do(g.withOrigin(ctx), g.in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			out, err := fn(ctx, tx, call, req)
			if err != nil {
				return ledger.Response{}, err
			}
			body, err := json.Marshal(out)
			if err != nil {
				return ledger.Response{}, invalid(err)
			}
			return ledger.Response{Body: body}, nil
		}, &ledger.DoOpts{Wait: wait, Mode: g.mode()})
		return err
	})
	g.report(ctx, ledger.OutcomeOf(res, err))
	if err != nil {
		return zero, toTemporal(err)
	}
	return decode[Resp](res.Body)
}

// mode is how the ledger claims the activity's key. On attempt 1 of an activity whose
// key comes from its own identity, no other attempt can hold the key, so no claim is
// sent at all. A retry most likely finds its result stored, which ModeLookUpFirst
// replays in one round trip; so may an activity whose key is handed in (a business key,
// a saga's step key), which others may share: it claims before fn is called, so fn is
// never called for a key another attempt holds.
func (g *guard) mode() ledger.Mode {
	if g.info.Attempt == 1 && g.derived {
		return ledger.ModeOptimistic
	}
	return ledger.ModeLookUpFirst
}

// DoErr is [Do] for an activity that returns only an error, func(ctx, Req) error: fn
// runs once per activity intent, and a retry after its commit returns nil without
// running it. A [Definitive] failure is stored and replayed like Do's.
func DoErr[Req any](ctx context.Context, req Req, fn func(ctx context.Context, tx pgx.Tx, call Call, req Req) error, opts *Opts) error {
	if fn == nil {
		return invalid(errNilFunc)
	}
	_, err := Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call Call, req Req) (struct{}, error) {
		return struct{}{}, fn(ctx, tx, call, req)
	}, opts)
	return err
}

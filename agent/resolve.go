package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// ErrNothingToResolve: [Guard.Resolve] named a call that is not uncertain.
var ErrNothingToResolve = errors.New("oncekit/agent: the call is not uncertain")

// Resolve settles an uncertain call (see [UncertainError]) after an operator checked the
// provider: with happened set, output becomes the call's stored output and every retry
// replays it; without, the call's key is released and the next attempt makes the call.
func (g *Guard) Resolve(ctx context.Context, ref CallRef, happened bool, output json.RawMessage) error {
	s, err := g.lookup(ctx, g.pool, ref)
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("%w: %s was never made", ErrNothingToResolve, ref)
	}
	in := ledger.Intent{Scope: keys.Scope{Tenant: ref.Tenant, Operation: OperationTool}, Key: ref.Key, Fingerprint: keys.Fingerprint(s.fingerprint)}
	claim, err := g.l.Claim(ctx, in, nil)
	if err != nil {
		return err
	}
	if claim.Lease == nil {
		return fmt.Errorf("%w: %s has a recorded outcome", ErrNothingToResolve, ref)
	}
	if !claim.Lease.Redrive {
		_ = g.l.Release(ctx, claim.Lease)
		return fmt.Errorf("%w: %s has no record in the ledger", ErrNothingToResolve, ref)
	}
	if !happened {
		return g.l.Release(ctx, claim.Lease)
	}
	if len(output) == 0 {
		output = json.RawMessage("null")
	}
	_, err = g.l.Complete(ctx, claim.Lease, ledger.Response{Body: output})
	return err
}

package agent

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// lostClaimsLimit bounds how many claims with a lost commit answer a guard remembers. A
// claim it does not remember is resumed as any other attempt's would be: after its lease,
// as an attempt that may have acted.
const lostClaimsLimit = 4096

// lostClaims remembers the leases of tool-call claims whose commit's answer was lost,
// before their tool started. A retry in the same process resumes such a lease, so it
// runs the tool once instead of reporting a call that never started as uncertain.
type lostClaims struct {
	mu sync.Mutex
	m  map[string]*ledger.Lease
}

func lostKey(c *call) string { return c.ref.Tenant + "\x00" + string(c.ref.Key) }

// put remembers lease, the claim of c whose commit's answer was lost.
func (l *lostClaims) put(c *call, lease *ledger.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*ledger.Lease{}
	}
	if len(l.m) < lostClaimsLimit {
		l.m[lostKey(c)] = lease
	}
}

// take returns and forgets the remembered lease of c, if one was claimed with c's
// arguments: a call with other arguments is refused, and leaves the lease for a retry
// with the first ones.
func (l *lostClaims) take(c *call) *ledger.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	lease := l.m[lostKey(c)]
	if lease == nil || lease.Fingerprint != c.in.Fingerprint {
		return nil
	}
	delete(l.m, lostKey(c))
	return lease
}

// resume takes back, in tx, the lease of a claim whose commit's answer was lost, and
// renews it for as long as the claim was made for. It returns false when the claim did
// not commit, or is no longer the lease's: another attempt took the key over or
// finished it, and the call is claimed as usual.
func (g *Guard) resume(ctx context.Context, tx pgx.Tx, lease *ledger.Lease) (bool, error) {
	rec, err := g.l.GetTx(ctx, tx, lease.Scope, lease.Key)
	if errors.Is(err, ledger.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.Expired || rec.State != ledger.StatePending || rec.OwnerToken != lease.Token || rec.Attempts != lease.Attempt {
		return false, nil
	}
	// The claim set its lease from the time it wrote the record.
	d := rec.LeaseUntil.Sub(rec.UpdatedAt)
	if d <= 0 {
		d = ledger.LeaseDefault
	}
	err = g.l.ExtendTx(ctx, tx, lease, d)
	if errors.Is(err, ledger.ErrLeaseLost) {
		return false, nil
	}
	return err == nil, err
}

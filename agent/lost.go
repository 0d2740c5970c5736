package agent

import (
	"context"
	"errors"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// lostClaimsLimit bounds how many claims with a lost commit answer a guard remembers. A
// claim it does not remember is resumed as any other attempt's would be: after its lease,
// as an attempt that may have acted.
const lostClaimsLimit = 4096

// lostClaims remembers the leases of tool-call claims whose commit's answer was lost,
// before their tool started. A retry in the same process resumes such a lease, so it
// runs the tool once instead of reporting a call that never started as uncertain. While
// one retry resumes a lease, the others of this process wait for it as for a call in
// progress: none of them takes the claim over as an attempt that may have acted.
type lostClaims struct {
	mu sync.Mutex
	m  map[string]*lostClaim
}

type lostClaim struct {
	lease *ledger.Lease
	busy  bool // a retry is resuming it
}

func lostKey(c *call) string { return c.ref.Tenant + "\x00" + string(c.ref.Key) }

// put remembers lease, the claim of c whose commit's answer was lost.
func (l *lostClaims) put(c *call, lease *ledger.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*lostClaim{}
	}
	if _, ok := l.m[lostKey(c)]; ok || len(l.m) < lostClaimsLimit {
		l.m[lostKey(c)] = &lostClaim{lease: lease}
	}
}

// take returns the remembered lease of c, if one was claimed with c's arguments, and
// marks it in use until [lostClaims.done]; busy reports that another retry is resuming
// it. A call with other arguments gets neither: it is refused by the ledger, and leaves
// the lease for a retry with the first ones.
func (l *lostClaims) take(c *call) (lease *ledger.Lease, busy bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[lostKey(c)]
	if e == nil || e.lease.Fingerprint != c.in.Fingerprint {
		return nil, false
	}
	if e.busy {
		return nil, true
	}
	e.busy = true
	return e.lease, false
}

// done ends the use of lease that take returned: keep leaves it for the next retry
// (nothing committed, or the answer was lost again), else it is forgotten. A lease put
// since in its place is left alone.
func (l *lostClaims) done(c *call, lease *ledger.Lease, keep bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[lostKey(c)]
	switch {
	case e == nil || e.lease != lease:
	case keep:
		e.busy = false
	default:
		delete(l.m, lostKey(c))
	}
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

// lostTasks remembers the owner tokens of task claims whose commit's answer was lost, so
// that ClaimTask again in this process resumes the claim if it committed (the ledger
// resumes a live lease by its token) instead of hearing it held by another agent until
// its lease runs out.
type lostTasks struct {
	mu sync.Mutex
	m  map[string]uuid.UUID
}

func taskKey(tenant, id string) string { return tenant + "\x00" + id }

func (l *lostTasks) put(tenant, id string, token uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]uuid.UUID{}
	}
	if _, ok := l.m[taskKey(tenant, id)]; ok || len(l.m) < lostClaimsLimit {
		l.m[taskKey(tenant, id)] = token
	}
}

// token is the remembered token of the task, or uuid.Nil.
func (l *lostTasks) token(tenant, id string) uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[taskKey(tenant, id)]
}

func (l *lostTasks) forget(tenant, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, taskKey(tenant, id))
}

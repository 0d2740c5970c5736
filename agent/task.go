package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Task is one task of an agent, such as a ticket: the calls it makes are keyed by its
// ID and their steps. A task claimed with [Guard.ClaimTask] is owned with a lease, and
// its calls are fenced: once another agent has taken it over, they are refused. A task
// from [Guard.Task] is not claimed: its owner is kept elsewhere, such as by a workflow.
type Task struct {
	// Tenant and ID name the task.
	Tenant string
	ID     string
	// Attempt counts the agents that claimed the task, this one included; 0 for a task
	// that was not claimed.
	Attempt int
	// TakenOver is true when an earlier agent claimed the task and did not finish it:
	// its completed calls replay, and its uncertain ones are reported.
	TakenOver bool

	g  *Guard
	mu sync.Mutex // guards lease's Until; held for no database work (see own)
	// lease is the task's claim, nil for a task not claimed; its fields other than
	// Until never change.
	lease *ledger.Lease
	// leaseFor is how long each renewal of the claim lasts: the lease the claim asked for.
	leaseFor time.Duration
	// created is when the task's record was created, as the claim read it: with the
	// lease's attempt, it tells this claim's record from a later claim's.
	created time.Time
}

// Task returns task id of tenant, not claimed: for agents whose runtime owns the task,
// such as a Temporal workflow. Its calls are guarded and not fenced.
func (g *Guard) Task(tenant, id string) *Task {
	return &Task{Tenant: tenant, ID: id, g: g}
}

// ClaimTaskOpts are per-call options of [Guard.ClaimTask]. A nil *ClaimTaskOpts means
// all defaults.
type ClaimTaskOpts struct {
	// Lease overrides [Config].TaskLease for this claim: its heartbeats and tool calls
	// renew it for this long too.
	Lease time.Duration
}

// ClaimTask claims task id of tenant for this agent with a lease and an owner token.
// Keep it with [Task.Heartbeat] and end it with [Task.Finish] or [Task.Release]. A task
// another agent holds is refused with ledger.ErrInProgress; a task whose owner's lease
// ran out is taken over (Task.TakenOver); a finished task is refused with
// [ErrTaskDone]. When the claim's answer was lost (an error that matches
// ledger.ErrOutcomeUnknown), ClaimTask again in the same process resumes the claim if
// it committed, while its lease lasts, rather than hear it held by another agent.
func (g *Guard) ClaimTask(ctx context.Context, tenant, id string, opts *ClaimTaskOpts) (*Task, error) {
	in, err := taskIntent(tenant, id)
	if err != nil {
		return nil, err
	}
	lease := g.cfg.TaskLease
	if opts != nil && opts.Lease > 0 {
		lease = opts.Lease
	}
	claim, err := g.l.Claim(ctx, in, &ledger.ClaimOpts{Lease: lease, Token: g.lostTasks.token(tenant, id)})
	var unknown *ledger.OutcomeUnknownError
	if errors.As(err, &unknown) {
		// The claim may have committed: a retry in this process resumes it, by its token,
		// while its lease lasts, rather than wait for the lease as for another agent's.
		g.lostTasks.put(tenant, id, unknown.Token)
	} else {
		g.lostTasks.forget(tenant, id)
	}
	var derr *ledger.DefinitiveError
	switch {
	case errors.As(err, &derr):
		return nil, fmt.Errorf("%w: %w", ErrTaskDone, err)
	case err != nil:
		return nil, err
	case claim.Lease == nil:
		return nil, fmt.Errorf("%w: task %q of tenant %q", ErrTaskDone, id, tenant)
	}
	return &Task{Tenant: tenant, ID: id, Attempt: claim.Lease.Attempt, TakenOver: claim.Lease.Redrive, g: g, lease: claim.Lease,
		leaseFor: lease, created: claim.Result.CreatedAt}, nil
}

func taskIntent(tenant, id string) (ledger.Intent, error) {
	if tenant == "" || id == "" {
		return ledger.Intent{}, errors.New("oncekit/agent: a task needs a tenant and an ID")
	}
	if err := storable("task", id); err != nil {
		return ledger.Intent{}, err
	}
	key, err := keys.Business("agent-task", id)
	if err != nil {
		return ledger.Intent{}, err
	}
	return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: OperationTask}, Key: key,
		Fingerprint: keys.FingerprintBytes([]byte(OperationTask))}, nil
}

// LeaseUntil returns when the task's claim runs out, or zero for a task not claimed.
func (t *Task) LeaseUntil() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lease == nil {
		return time.Time{}
	}
	return t.lease.Until
}

// Heartbeat renews the task's claim for its lease (ClaimTaskOpts.Lease, else the
// guard's TaskLease). It returns a [*StaleOwnerError] when another agent took the task
// over: stop working on it.
func (t *Task) Heartbeat(ctx context.Context) error {
	if t.lease == nil {
		return nil
	}
	l := t.own()
	if err := t.g.l.Extend(ctx, l, t.leaseFor); err != nil {
		return t.stale(err)
	}
	t.renewed(l)
	return nil
}

// own returns a copy of the task's lease, to renew or end with the ledger without
// holding t.mu: a call that waits for t.mu holds a pooled connection, so holding t.mu
// while waiting for one could leave the pool's last connections waiting for each other.
func (t *Task) own() *ledger.Lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := *t.lease
	return &l
}

// renewed keeps the later end of the task's lease, once l's renewal committed; a nil l
// (a task not claimed) is ignored.
func (t *Task) renewed(l *ledger.Lease) {
	if l == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.Until.After(t.lease.Until) {
		t.lease.Until = l.Until
	}
}

// fence renews the task's claim inside tx, the transaction that claims a tool call:
// the row lock it takes keeps another agent from taking the task over until tx ends,
// and a claim that passed to another agent refuses the call. It returns the renewed
// lease (nil for a task not claimed), which the caller keeps with [Task.renewed] once
// tx committed: a renewal rolled back with a refused call renewed nothing.
func (t *Task) fence(ctx context.Context, tx pgx.Tx) (*ledger.Lease, error) {
	if t.lease == nil {
		return nil, nil
	}
	l := t.own()
	if err := t.g.l.ExtendTx(ctx, tx, l, t.leaseFor); err != nil {
		return nil, t.stale(err)
	}
	return l, nil
}

func (t *Task) stale(err error) error {
	if errors.Is(err, ledger.ErrLeaseLost) {
		return &StaleOwnerError{Tenant: t.Tenant, Task: t.ID}
	}
	return err
}

// Finish records the task's outcome and ends the claim: a later claim of the task is
// refused with [ErrTaskDone]. It returns a [*StaleOwnerError] when another agent took
// the task over. Finish is idempotent for its owner: a retry, such as after an error
// that says the outcome of the first is unknown (ledger.ErrOutcomeUnknown), returns nil
// when this owner's Finish committed with the same outcome, and an error that matches
// [ErrTaskDone] when it committed with another.
func (t *Task) Finish(ctx context.Context, outcome json.RawMessage) error {
	if t.lease == nil {
		return nil
	}
	if len(outcome) == 0 {
		outcome = json.RawMessage("null")
	}
	_, err := t.g.l.Complete(ctx, t.own(), ledger.Response{Body: outcome})
	var lost *ledger.LeaseLostError
	if errors.As(err, &lost) && t.finishedByThisClaim(lost.Current) {
		if bytes.Equal(lost.Current.Response.Body, outcome) {
			return nil
		}
		return fmt.Errorf("%w: task %q of tenant %q was finished by this agent with another outcome (%s)",
			ErrTaskDone, t.ID, t.Tenant, clip(lost.Current.Response.Body))
	}
	return t.stale(err)
}

// finishedByThisClaim reports whether rec, the task's record, was completed under this
// task's claim. Only the claim's owner completes it, and every later claim counts one
// more attempt (or, once the record expired, begins a new record), so a completed
// record with the claim's attempt and creation time was completed by this owner.
func (t *Task) finishedByThisClaim(rec *ledger.Record) bool {
	return rec != nil && rec.State == ledger.StateCompleted && !rec.Expired &&
		rec.Attempts == t.lease.Attempt && rec.CreatedAt.Equal(t.created)
}

// Release gives the task up unfinished, such as on shutdown, so that another agent may
// claim it at once; its calls keep their records and replay.
func (t *Task) Release(ctx context.Context) error {
	if t.lease == nil {
		return nil
	}
	// MarkUncertain, unlike the ledger's Release, keeps the task's attempt count: the
	// next agent sees it as a take-over.
	return t.stale(t.g.l.MarkUncertain(ctx, t.own()))
}

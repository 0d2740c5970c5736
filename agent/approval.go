package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/keys"
)

// FrozenCall is a call waiting for a person's decision, as it was frozen before anyone
// saw it: its place, its arguments and their fingerprint. A decision names the
// fingerprint, so it applies to these arguments alone.
type FrozenCall struct {
	Call        CallRef
	Args        json.RawMessage
	Fingerprint keys.Fingerprint
	Deadline    time.Time
}

// gate freezes a call that needs approval and lets it through once approved: it
// returns nil for an approved call with the same arguments, and an
// [*ApprovalPendingError], a [*RejectedError] or an [*ArgumentsChangedError] otherwise.
func (g *Guard) gate(ctx context.Context, t *Task, c *call) error {
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fenced, err := t.fence(ctx, tx)
	if err != nil {
		return err
	}
	if err := g.freeze(ctx, tx, c); err != nil {
		return err
	}
	s, err := g.lookup(ctx, tx, c.ref)
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("oncekit/agent: %s has no frozen record", c.ref)
	}
	if s.fingerprint != string(c.in.Fingerprint) {
		return &ArgumentsChangedError{Call: c.ref, Stored: json.RawMessage(s.args), New: c.args}
	}
	switch {
	case s.approval == "approved":
		return nil
	case s.approval == "rejected":
		return &RejectedError{Call: c.ref, By: s.by, Reason: s.reason, TimedOut: s.by == "" && s.reason == "timeout"}
	case s.timedOut:
		if _, err := tx.Exec(ctx, g.q.timeout, c.ref.Tenant, string(c.ref.Key), g.now()); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		t.renewed(fenced)
		return &RejectedError{Call: c.ref, Reason: "timeout", TimedOut: true}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	t.renewed(fenced)
	var deadline time.Time
	if s.deadline != nil {
		deadline = *s.deadline
	}
	return &ApprovalPendingError{Call: c.ref, Deadline: deadline}
}

// Waiting lists up to limit calls of tenant that wait for a decision, the nearest
// deadline first.
func (g *Guard) Waiting(ctx context.Context, tenant string, limit int) ([]FrozenCall, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := g.pool.Query(ctx, g.q.waiting, tenant, g.now(), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []FrozenCall
	for rows.Next() {
		var f FrozenCall
		var key, args, fp string
		if err := rows.Scan(&key, &f.Call.Task, &f.Call.Step, &f.Call.Tool, &args, &fp, &f.Deadline); err != nil {
			return nil, err
		}
		f.Call.Tenant, f.Call.Key, f.Args, f.Fingerprint = tenant, keys.Key(key), json.RawMessage(args), keys.Fingerprint(fp)
		out = append(out, f)
	}
	return out, rows.Err()
}

// Approve lets the frozen call run, once: the call must be made again with the same
// arguments, and a call at its place with other arguments stays refused. by names the
// person, for the record. It fails when the call is not waiting with that fingerprint:
// decided already, past its deadline (a rejection), or frozen with other arguments.
func (g *Guard) Approve(ctx context.Context, f FrozenCall, by, reason string) error {
	return g.decide(ctx, f, "approved", by, reason)
}

// Reject refuses the frozen call: every attempt of it returns a [*RejectedError].
func (g *Guard) Reject(ctx context.Context, f FrozenCall, by, reason string) error {
	return g.decide(ctx, f, "rejected", by, reason)
}

// ErrNotWaiting: a decision named a call that does not wait for one with those
// arguments.
var ErrNotWaiting = errors.New("oncekit/agent: the call does not wait for a decision with these arguments")

func (g *Guard) decide(ctx context.Context, f FrozenCall, decision, by, reason string) error {
	if by == "" {
		return errors.New("oncekit/agent: a decision needs the name of who made it")
	}
	tag, err := g.pool.Exec(ctx, g.q.decide, f.Call.Tenant, string(f.Call.Key), string(f.Fingerprint), decision, by, reason, g.now())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s (decided already, past its deadline, or frozen with other arguments)", ErrNotWaiting, f.Call)
	}
	return nil
}

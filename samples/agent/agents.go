package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

const (
	oncekitAgent = "oncekit"
	naiveAgent   = "naive"
	tenant       = "support"
	// deliveryLease is how long a delivery stays hidden from other pollers; the
	// oncekit agent's task and call leases are as long, so a dead agent's ticket is
	// taken over soon after it is delivered again.
	deliveryLease = time.Second
	// approvalLimit is the refund from which the operator must approve.
	approvalLimit = 100
)

// chance is a number in [0, 1) fixed by the seed, the agent, the ticket and what is
// decided, so both agents meet the same faults on the same tickets.
func chance(seed uint64, agentName string, ticket int, what string) float64 {
	_ = agentName // both agents meet the same plan
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%s", seed, ticket, what)
	return float64(h.Sum64()>>11) / math.Exp2(53)
}

// ticket is one support ticket.
type ticket struct {
	ID       int
	Customer string
	Kind     string // "refund" or "question"
	Amount   int
}

// call is one tool call the model chose.
type call struct {
	Tool string
	Args json.RawMessage
}

// model is the scripted model: deterministic, no network. Asked again on a retry
// (attempt > 1), it words the email otherwise one time in ten, as a real model may.
func model(seed uint64, t ticket, attempt int) []call {
	var calls []call
	if t.Kind == "refund" {
		calls = append(calls, call{"refund", mustJSON(map[string]any{"ticket": t.ID, "amount": t.Amount})})
	}
	subject := fmt.Sprintf("About your ticket %d", t.ID)
	if attempt > 1 && chance(seed, "", t.ID, "change-mind-"+strconv.Itoa(attempt)) < 0.10 {
		subject = fmt.Sprintf("Re: ticket %d, an update", t.ID)
	}
	calls = append(calls,
		call{"send_email", mustJSON(map[string]any{"to": t.Customer, "subject": subject})},
		call{"notify_team", mustJSON(map[string]any{"ticket": t.ID, "text": "handled"})})
	return calls
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// env is what an agent process works with.
type env struct {
	name   string
	pool   *pgxpool.Pool
	seed   uint64
	email  string
	refund string
	smtp   string
}

// crashAfter SIGKILLs this process right after a tool acted, once per ticket and tool
// for the tickets the seed picks.
func (e *env) crashAfter(ctx context.Context, ticket int, tool string, p float64) {
	if chance(e.seed, e.name, ticket, "crash-"+tool) >= p {
		return
	}
	tag, err := e.pool.Exec(ctx, `INSERT INTO faults (agent, ticket, fault) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, e.name, ticket, "crash-"+tool)
	if err == nil && tag.RowsAffected() == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// post calls an HTTP tool; key is the Idempotency-Key, or "" for none.
func (e *env) post(ctx context.Context, url string, ticket int, key string, args json.RawMessage) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(args))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Agent", e.name)
	req.Header.Set("X-Ticket", strconv.Itoa(ticket))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = ledger.NotApplied(fmt.Errorf("status %d: %s", resp.StatusCode, body))
	}
	return body, err
}

// mail sends the team a message over SMTP, which takes no key.
func (e *env) mail(ticket int, args json.RawMessage) (json.RawMessage, error) {
	c, err := smtp.Dial(e.smtp)
	if err != nil {
		return nil, ledger.NotApplied(err)
	}
	defer func() { _ = c.Close() }()
	msg := fmt.Sprintf("From: agent@example.com\r\nTo: team@example.com\r\nX-Agent: %s\r\nX-Ticket: %d\r\n\r\n%s\r\n", e.name, ticket, args)
	if err := c.SendMail("agent@example.com", []string{"team@example.com"}, strings.NewReader(msg)); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"queued":true}`), nil
}

// run makes a tool call; key is sent where the provider takes one.
func (e *env) run(ctx context.Context, t ticket, c call, key string) (json.RawMessage, error) {
	var out json.RawMessage
	var err error
	switch c.Tool {
	case "refund":
		out, err = e.post(ctx, e.refund+"/refunds", t.ID, key, c.Args)
	case "send_email":
		out, err = e.post(ctx, e.email+"/emails", t.ID, key, c.Args)
	case "notify_team":
		out, err = e.mail(t.ID, c.Args)
	default:
		return nil, fmt.Errorf("no tool %q", c.Tool)
	}
	if err == nil {
		e.crashAfter(ctx, t.ID, c.Tool, map[string]float64{"refund": 0.05, "send_email": 0.10, "notify_team": 0.05}[c.Tool])
	}
	return out, err
}

// delivery is one delivery of a ticket, hidden from other pollers for a lease.
type delivery struct {
	id      int64
	attempt int
	t       ticket
}

func (e *env) poll(ctx context.Context) (*delivery, error) { return e.pollFor(ctx, deliveryLease) }

// pollFor takes the next visible delivery and hides it for lease.
func (e *env) pollFor(ctx context.Context, lease time.Duration) (*delivery, error) {
	var d delivery
	err := e.pool.QueryRow(ctx, `UPDATE deliveries SET visible_at = now() + $2::interval, attempts = attempts + 1
		WHERE id = (SELECT id FROM deliveries WHERE agent = $1 AND visible_at <= now() ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
		RETURNING id, attempts, ticket`, e.name, lease.String()).Scan(&d.id, &d.attempt, &d.t.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	err = e.pool.QueryRow(ctx, `SELECT customer, kind, amount FROM tickets WHERE agent = $1 AND id = $2`, e.name, d.t.ID).
		Scan(&d.t.Customer, &d.t.Kind, &d.t.Amount)
	return &d, err
}

func (e *env) done(ctx context.Context, d *delivery) error {
	_, err := e.pool.Exec(ctx, `DELETE FROM deliveries WHERE id = $1`, d.id)
	return err
}

func (e *env) later(ctx context.Context, d *delivery) error {
	_, err := e.pool.Exec(ctx, `UPDATE deliveries SET visible_at = now() + interval '100 milliseconds' WHERE id = $1`, d.id)
	return err
}

func (e *env) event(ctx context.Context, ticket int, kind, detail string) {
	_, _ = e.pool.Exec(ctx, `INSERT INTO events (agent, ticket, kind, detail) VALUES ($1, $2, $3, $4)`, e.name, ticket, kind, detail)
}

func (e *env) outcome(ctx context.Context, ticket int, outcome string) error {
	_, err := e.firstOutcome(ctx, ticket, outcome)
	return err
}

// firstOutcome records a ticket's outcome and reports whether it was the first.
func (e *env) firstOutcome(ctx context.Context, ticket int, outcome string) (bool, error) {
	tag, err := e.pool.Exec(ctx, `INSERT INTO outcomes (agent, ticket, outcome) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, e.name, ticket, outcome)
	return err == nil && tag.RowsAffected() == 1, err
}

// loop polls the inbox until ctx ends, handling each delivery with handle.
func (e *env) loop(ctx context.Context, handle func(context.Context, *delivery) error) error {
	for ctx.Err() == nil {
		d, err := e.poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped
			}
			return err
		}
		if d == nil {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if err := handle(ctx, d); err != nil && ctx.Err() == nil {
			return fmt.Errorf("ticket %d: %w", d.t.ID, err)
		}
	}
	return nil
}

// naive handles a delivery as agent samples do: call each tool the model chose, and
// retry a call that failed.
func (e *env) naive(ctx context.Context, d *delivery) error {
	for i, c := range model(e.seed, d.t, d.attempt) {
		var err error
		for try := 0; try < 3; try++ {
			if try > 0 {
				c = model(e.seed, d.t, d.attempt+try)[i] // the retry asks the model again
			}
			if _, err = e.run(ctx, d.t, c, ""); err == nil {
				break
			}
		}
		if err != nil {
			return err
		}
	}
	if err := e.outcome(ctx, d.t.ID, "finished"); err != nil {
		return err
	}
	return e.done(ctx, d)
}

// guarded handles a delivery on package agent: the ticket is a claimed task and each
// call is keyed by its step.
type guarded struct {
	*env
	g     *agent.Guard
	tools map[string]agent.Tool
}

func newGuarded(e *env) (*guarded, error) {
	l, err := ledger.New(e.pool, &ledger.Config{Schema: demoSchema, Lease: deliveryLease})
	if err != nil {
		return nil, err
	}
	g, err := agent.New(l, &agent.Config{TaskLease: deliveryLease, ApprovalTimeout: time.Minute})
	if err != nil {
		return nil, err
	}
	return &guarded{env: e, g: g, tools: map[string]agent.Tool{
		"refund":      {Name: "refund", AcceptsKey: true},
		"send_email":  {Name: "send_email", AcceptsKey: true},
		"notify_team": {Name: "notify_team"},
	}}, nil
}

func (a *guarded) handle(ctx context.Context, d *delivery) error {
	task, err := a.g.ClaimTask(ctx, tenant, strconv.Itoa(d.t.ID), nil)
	switch {
	case errors.Is(err, agent.ErrTaskDone):
		return a.done(ctx, d) // a second delivery of a finished ticket
	case errors.Is(err, ledger.ErrInProgress):
		return nil // another agent holds it; the delivery comes back after its lease
	case err != nil:
		return err
	}
	outcome := "finished"
	for i, c := range model(a.seed, d.t, d.attempt) {
		tool := a.tools[c.Tool]
		tool.NeedsApproval = c.Tool == "refund" && d.t.Amount >= approvalLimit
		var res agent.Result
		for try := 0; ; try++ {
			if try > 0 {
				c = model(a.seed, d.t, d.attempt+try)[i] // the retry asks the model again
			}
			res, err = task.Call(ctx, strconv.Itoa(i+1), tool, c.Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				return a.run(ctx, d.t, c, string(inv.DownstreamKey))
			}, &agent.CallOpts{Wait: 2 * deliveryLease})
			var changed *agent.ArgumentsChangedError
			switch {
			case errors.As(err, &changed):
				a.event(ctx, d.t.ID, "changed", c.Tool)
				err = nil // the model is told what was done, with the first arguments
			case errors.Is(err, agent.ErrUncertain):
				a.event(ctx, d.t.ID, "uncertain", c.Tool)
				outcome, err = "escalated", nil
			case errors.Is(err, agent.ErrRejected):
				outcome, err = "escalated", nil
			case errors.Is(err, agent.ErrApprovalPending):
				if err := task.Release(ctx); err != nil {
					return err
				}
				return a.later(ctx, d)
			case err != nil && try < 3 && tool.AcceptsKey && !errors.Is(err, agent.ErrStaleOwner):
				continue // a lost answer: the call is made again with the same key
			}
			break
		}
		_ = res
		if errors.Is(err, agent.ErrStaleOwner) {
			return nil // another agent took the ticket over
		}
		if err != nil {
			return err
		}
		if outcome == "escalated" {
			break
		}
	}
	if err := a.outcome(ctx, d.t.ID, outcome); err != nil {
		return err
	}
	if err := task.Finish(ctx, mustJSON(map[string]string{"outcome": outcome})); err != nil {
		if errors.Is(err, agent.ErrStaleOwner) {
			return nil
		}
		return err
	}
	return a.done(ctx, d)
}

package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
)

// outcome is how a run ended, collected off the test's goroutine.
type outcome struct {
	out, errType string
	err          error
}

func await(run client.WorkflowRun) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var o outcome
		o.err = run.Get(ctx, &o.out)
		var app *temporal.ApplicationError
		if errors.As(o.err, &app) {
			o.errType = app.Type()
		}
		ch <- o
	}()
	return ch
}

// leaseUntil returns when the saga's lease runs out, by the database's clock.
func (m *moneyBank) leaseUntil(t *testing.T, id string) time.Time {
	t.Helper()
	rec, err := m.l.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: saga.Operation}, orderKey(id))
	require.NoError(t, err)
	return rec.LeaseUntil
}

// entered waits for the order's compensation to fail in the outage.
func (m *moneyBank) waitOutage(t *testing.T, id string) {
	t.Helper()
	for {
		select {
		case got := <-m.entered:
			if got == id {
				return
			}
		case <-time.After(time.Minute):
			t.Fatalf("the compensation of %s never met the outage", id)
		}
	}
}

// The first run's last step fails and its compensation retries through an outage that
// lasts several of the saga's (short) leases. A second workflow for the same order,
// submitted meanwhile, must not take the key of a saga that is still running: it waits,
// and both end with the first run's outcome, the money back where it was.
func TestRun_LiveSagaKeepsItsKeyThroughALongCompensation(t *testing.T) {
	t.Parallel()
	b := newServerBank(t)
	const lease = 2 * time.Second
	o := order{ID: "long-compensation", Lease: lease}
	b.failing.Store(o.ID, "notify")
	b.outage.Store(o.ID, "withdraw")
	first := await(b.start(t, "long-compensation-1", o))
	b.waitOutage(t, o.ID)
	b.failing.Delete(o.ID) // a second run that took the key over would now complete the order
	held := b.leaseUntil(t, o.ID)
	second := await(b.start(t, "long-compensation-2", o))

	// Wait until the key has been held for three leases past the outage's start, or the
	// second run ended (which it must not, while the first compensates).
	var early *outcome
	require.Eventually(t, func() bool {
		select {
		case got := <-second:
			early = &got
			return true
		default:
		}
		return b.leaseUntil(t, o.ID).After(held.Add(3 * lease))
	}, time.Minute, 50*time.Millisecond)
	require.Nil(t, early, "the second run ended while the first still held the saga: %+v", early)

	b.outage.Delete(o.ID)
	a, c := <-first, <-second
	require.Equal(t, compensated, a.errType, "%v", a.err)
	require.Equal(t, compensated, c.errType, "the second run returns the first run's outcome: %v", c.err)
	state, code := b.recorded(t, o.ID)
	require.Equal(t, ledger.StateFailed, state)
	require.Equal(t, compensated, code)
	require.Equal(t, restored, b.net(t, o.ID))
}

// A saga whose run is truly dead (terminated in the middle of its compensations, after it
// had undone the deposit) is taken over by the next run with its key once the lease runs
// out. The taker does not run the saga forward over half-undone money: it finds that the
// dead run had begun compensating, finishes the compensations, and records the saga as
// compensated.
func TestRun_DeadSagaIsTakenOverAndCompensated(t *testing.T) {
	t.Parallel()
	b := newServerBank(t)
	const lease = 2 * time.Second
	o := order{ID: "dead-compensation", Lease: lease}
	b.failing.Store(o.ID, "notify")
	b.outage.Store(o.ID, "withdraw")
	run := b.start(t, "dead-compensation-1", o)
	b.waitOutage(t, o.ID)
	require.Equal(t, map[string]int{"withdraw": 1, "deposit": 0, "notify": 0}, b.net(t, o.ID), "the deposit was undone before the outage")
	require.NoError(t, b.c.TerminateWorkflow(context.Background(), run.GetID(), run.GetRunID(), "test: the run dies"))
	b.failing.Delete(o.ID)
	b.outage.Delete(o.ID)

	out := <-await(b.start(t, "dead-compensation-2", o))
	require.Equal(t, compensated, out.errType, "%v", out.err)
	state, code := b.recorded(t, o.ID)
	require.Equal(t, ledger.StateFailed, state)
	require.Equal(t, compensated, code)
	require.Equal(t, restored, b.net(t, o.ID))
}

// A run that takes over a dead saga reports the dead run's cause as that run would have:
// once, with its type, and a later workflow with the key returns the same error.
func TestRun_TakenOverSagaSaysItsCauseOnce(t *testing.T) {
	t.Parallel()
	b := newServerBank(t)
	o := order{ID: "dead-cause", Lease: 2 * time.Second}
	b.failing.Store(o.ID, "notify")
	b.outage.Store(o.ID, "withdraw")
	run := b.start(t, "dead-cause-1", o)
	b.waitOutage(t, o.ID)
	require.NoError(t, b.c.TerminateWorkflow(context.Background(), run.GetID(), run.GetRunID(), "test: the run dies"))
	b.failing.Delete(o.ID)
	b.outage.Delete(o.ID)

	taker := <-await(b.start(t, "dead-cause-2", o))
	var top, cause *temporal.ApplicationError
	require.ErrorAs(t, taker.err, &top)
	require.Equal(t, compensated, top.Type())
	require.ErrorAs(t, errors.Unwrap(top), &cause, "the taker's error carries the dead run's cause")
	require.Contains(t, cause.Message(), "the notify service is down")
	require.Equal(t, 1, strings.Count(top.Error(), "(type: "+cause.Type()+","), "the cause's type is said more than once: %v", top)

	probe := <-await(b.start(t, "dead-cause-3", o))
	var again, cause2 *temporal.ApplicationError
	require.ErrorAs(t, probe.err, &again)
	require.Equal(t, top.Message(), again.Message())
	require.Equal(t, top.Error(), again.Error())
	require.ErrorAs(t, errors.Unwrap(again), &cause2)
	require.Equal(t, cause.Type(), cause2.Type())
	require.Equal(t, restored, b.net(t, o.ID))
}

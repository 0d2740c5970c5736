package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// heldLedger is a ledger on the test schema whose commits PostgreSQL makes durable and
// holds before answering, so that a test can end the connection between a commit and
// its answer.
func heldLedger(t *testing.T, b *testBundle) (*ledger.Ledger, *pgtest.Held) {
	t.Helper()
	h := pgtest.NewHeld(t, b.schema)
	l, err := ledger.New(h.Pool, &ledger.Config{Schema: b.schema, Test: ledger.TestConfig{NowFunc: b.clock.Now}})
	require.NoError(t, err)
	return l, h
}

// A commit that became durable and whose answer was a FATAL error (the backend
// terminated while the commit was held): Do says the outcome is unknown, never that it
// rolled back, in every mode; and a retry with the same key replays the committed result.
func TestDo_CommittedThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, b := setup(t, nil)
		lh, h := heldLedger(t, b)
		ctx := context.Background()
		req := order{Item: "lamp", Amount: 4200}
		in := intent(t, "acme", "order-lamp", req)

		done := h.TerminateAsync(ctx, t, 10*time.Second)
		_, err := lh.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: mode})
		<-done
		var unknown *ledger.OutcomeUnknownError
		require.ErrorAs(t, err, &unknown, "a lost answer to COMMIT must not read as a rollback")
		require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
		require.Equal(t, in.Key, unknown.Key)
		require.Equal(t, 1, countOrders(t, b.pool, "acme"), "the commit was durable")

		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: mode, Wait: 10 * time.Second})
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, 1, countOrders(t, b.pool, "acme"))
	})
}

// A definitive failure whose commit's answer is lost is unknown too, and a retry
// replays the stored failure.
func TestDo_StoredFailureThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	lh, h := heldLedger(t, b)
	ctx := context.Background()
	in := intent(t, "acme", "order-declined", order{Item: "tv", Amount: 1})
	declined := func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{}, &ledger.DefinitiveError{Code: "card_declined", Message: "declined"}
	}
	done := h.TerminateAsync(ctx, t, 10*time.Second)
	_, err := lh.Do(ctx, in, declined, nil)
	<-done
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	var derr *ledger.DefinitiveError
	require.False(t, errors.As(err, &derr), "an unknown outcome is not the stored failure")

	_, err = l.Do(ctx, in, declined, nil)
	require.ErrorAs(t, err, &derr)
	require.True(t, derr.Replayed)
}

// Claim, Complete, Fail, MarkUncertain, Release and Extend commit by themselves: a
// FATAL after their commit is an unknown outcome, and the way the error says to settle
// it works.
func TestClaimAndFinish_CommittedThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		l, b := setup(t, nil)
		lh, h := heldLedger(t, b)
		in := intent(t, "acme", "charge-1", order{Item: "tv", Amount: 1})
		done := h.TerminateAsync(ctx, t, 10*time.Second)
		_, err := lh.Claim(ctx, in, nil)
		<-done
		var unknown *ledger.OutcomeUnknownError
		require.ErrorAs(t, err, &unknown)
		require.NotEqual(t, uuid.Nil, unknown.Token)
		// The claim committed: the same token resumes it.
		res, err := l.Claim(ctx, in, &ledger.ClaimOpts{Token: unknown.Token})
		require.NoError(t, err)
		require.NotNil(t, res.Lease)
		require.Equal(t, unknown.Token, res.Lease.Token)
		require.False(t, res.Lease.Redrive)
	})

	finishes := map[string]func(l *ledger.Ledger, lease *ledger.Lease) error{
		"Complete": func(l *ledger.Ledger, lease *ledger.Lease) error {
			_, err := l.Complete(ctx, lease, ledger.Response{Code: 200, Body: []byte(`{"charged":true}`)})
			return err
		},
		"Fail": func(l *ledger.Ledger, lease *ledger.Lease) error {
			return l.Fail(ctx, lease, &ledger.DefinitiveError{Code: "card_declined"})
		},
		"MarkUncertain": func(l *ledger.Ledger, lease *ledger.Lease) error { return l.MarkUncertain(ctx, lease) },
		"Release":       func(l *ledger.Ledger, lease *ledger.Lease) error { return l.Release(ctx, lease) },
		"Extend":        func(l *ledger.Ledger, lease *ledger.Lease) error { return l.Extend(ctx, lease, time.Minute) },
	}
	for name, finish := range finishes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, b := setup(t, nil)
			lh, h := heldLedger(t, b)
			in := intent(t, "acme", "charge-"+name, order{Item: "tv", Amount: 1})
			claimed, err := l.Claim(ctx, in, nil)
			require.NoError(t, err)
			before := lookup(t, l, in)

			done := h.TerminateAsync(ctx, t, 10*time.Second)
			err = finish(lh, claimed.Lease)
			<-done
			var unknown *ledger.OutcomeUnknownError
			require.ErrorAs(t, err, &unknown)
			require.Equal(t, claimed.Lease.Token, unknown.Token)
			after := lookup(t, l, in)
			require.NotEqual(t, before, after, "the finish committed")
		})
	}
}

// lookup returns the key's record as a comparable summary, or "absent".
func lookup(t *testing.T, l *ledger.Ledger, in ledger.Intent) string {
	t.Helper()
	rec, err := l.Get(context.Background(), in.Scope, in.Key)
	if errors.Is(err, ledger.ErrNotFound) {
		return "absent"
	}
	require.NoError(t, err)
	return string(rec.State) + "/" + rec.OwnerToken.String() + "/" + rec.LeaseUntil.String() + "/" + boolString(rec.Uncertain)
}

func boolString(b bool) string {
	if b {
		return "uncertain"
	}
	return "certain"
}

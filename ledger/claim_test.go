package ledger_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/ledger"
)

// provider stands in for an external payment API: it counts the calls it receives per
// downstream key, the way a real provider's own ledger would.
type provider struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *provider) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[string]int{}
	}
	p.calls[key]++
	return `{"charge":"ch_` + key + `"}`
}

// The lease runs out; another owner takes the key over and re-drives the call with the
// same key; the stale owner can no longer complete.
func TestClaim_LeaseExpiryAndFencing(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "pay-1", order{Item: "card", Amount: 500})

	first, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, first.Lease)
	require.Equal(t, 1, first.Lease.Attempt)
	require.False(t, first.Lease.Redrive)

	// While the lease is live, a duplicate fails fast, by default or with NoWait.
	_, err = l.Claim(ctx, in, nil)
	require.ErrorIs(t, err, ledger.ErrInProgress)
	_, err = l.Claim(ctx, in, &ledger.ClaimOpts{Wait: ledger.NoWait})
	require.ErrorIs(t, err, ledger.ErrInProgress)

	// The first owner "crashes" after calling the provider. The lease runs out.
	b.clock.Advance(2 * time.Minute)
	second, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	require.NotNil(t, second.Lease)
	require.True(t, second.Lease.Redrive)
	require.Equal(t, 2, second.Lease.Attempt)
	require.NotEqual(t, first.Lease.Token, second.Lease.Token)

	// The stale owner wakes up and tries to complete: refused.
	_, err = l.Complete(ctx, first.Lease, ledger.Response{Code: 200, Body: []byte("stale")})
	require.ErrorIs(t, err, ledger.ErrLeaseLost)
	var lost *ledger.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.NotNil(t, lost.Current)
	require.Equal(t, second.Lease.Token, lost.Current.OwnerToken)
	require.ErrorIs(t, l.Release(ctx, first.Lease), ledger.ErrLeaseLost)

	res, err := l.Complete(ctx, second.Lease, ledger.Response{Code: 200, Body: []byte("fresh")})
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempts)

	again, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.Nil(t, again.Lease)
	require.True(t, again.Result.Replayed)
	require.Equal(t, []byte("fresh"), again.Result.Body)
}

// A workflow activity completes its external call and crashes before reporting
// completion: the retry re-drives the call with the same downstream key, the provider
// deduplicates it, and the effect exists once.
func TestClaim_CrashAfterExternalCallRedrivesWithSameKey(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "pay-2", order{Item: "card", Amount: 700})
	p := &provider{}
	downstream := string(in.Key) + "/charge"

	c1, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: 30 * time.Second})
	require.NoError(t, err)
	p.charge(downstream) // the call happens, then the worker dies: no Complete

	b.clock.Advance(time.Minute)
	c2, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: 30 * time.Second})
	require.NoError(t, err)
	require.True(t, c2.Lease.Redrive)
	body := p.charge(downstream) // re-driven with the same key
	_, err = l.Complete(ctx, c2.Lease, ledger.Response{Code: 200, Body: []byte(body)})
	require.NoError(t, err)
	require.NotEqual(t, c1.Lease.Token, c2.Lease.Token)

	c3, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.Nil(t, c3.Lease, "completed: nothing to call")
	require.Equal(t, []byte(body), c3.Result.Body)
	require.Len(t, p.calls, 1, "one downstream key for every attempt")
}

// An uncertain outcome ends the lease at once; the next attempt re-drives it and the
// payload stays bound to the key.
func TestClaim_UncertainOutcome(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "pay-3", order{Item: "card", Amount: 900})
	c1, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.NoError(t, l.MarkUncertain(ctx, c1.Lease))

	other := intent(t, "acme", "pay-3", order{Item: "card", Amount: 901})
	_, err = l.Claim(ctx, other, nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)

	c2, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.True(t, c2.Lease.Redrive)
	require.True(t, c2.Lease.Uncertain)
	require.NoError(t, l.Fail(ctx, c2.Lease, ledger.Definitive("card_declined", "insufficient funds")))

	c3, err := l.Claim(ctx, in, nil)
	var derr *ledger.DefinitiveError
	require.ErrorAs(t, err, &derr)
	require.True(t, derr.Replayed)
	require.Equal(t, "card_declined", derr.Code)
	require.Nil(t, c3.Lease)
}

// Release frees the key for a fresh start; Extend keeps a long call's lease alive.
func TestClaim_ReleaseAndExtend(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "pay-4", order{Item: "card", Amount: 1})
	c1, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	until := c1.Lease.Until
	b.clock.Advance(50 * time.Second)
	require.NoError(t, l.Extend(ctx, c1.Lease, time.Minute))
	require.True(t, c1.Lease.Until.After(until))
	b.clock.Advance(50 * time.Second) // past the first lease, within the extension
	_, err = l.Claim(ctx, in, nil)
	require.ErrorIs(t, err, ledger.ErrInProgress)

	require.NoError(t, l.Release(ctx, c1.Lease))
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)
	c2, err := l.Claim(ctx, in, nil)
	require.NoError(t, err)
	require.Equal(t, 1, c2.Lease.Attempt)
	require.False(t, c2.Lease.Redrive)
}

// Many attempts race to take over one expired lease: exactly one wins.
func TestClaim_RaceForExpiredLease(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "pay-5", order{Item: "card", Amount: 2})
	_, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Second})
	require.NoError(t, err)
	b.clock.Advance(time.Minute)

	var wins, busy atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			res, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour})
			switch {
			case err == nil && res.Lease != nil:
				wins.Add(1)
			case errors.Is(err, ledger.ErrInProgress):
				busy.Add(1)
			default:
				t.Errorf("unexpected: %+v %v", res, err)
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, int32(1), wins.Load())
	require.Equal(t, int32(31), busy.Load())
}

// An owner that claims with its own token finds its live claim again instead of waiting
// for itself; any other owner still waits, and a finished key replays for everyone.
func TestClaim_TokenResumesOwnClaim(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "saga-1", order{Item: "saga", Amount: 1})
	token := uuid.New()

	first, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour, Token: token})
	require.NoError(t, err)
	require.NotNil(t, first.Lease)
	require.Equal(t, token, first.Lease.Token)

	again, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour, Token: token})
	require.NoError(t, err)
	require.NotNil(t, again.Lease, "the same token resumes its own live claim")
	require.Equal(t, 1, again.Lease.Attempt)
	require.False(t, again.Lease.Redrive)
	require.Equal(t, first.Lease.Until, again.Lease.Until)

	_, err = l.Claim(ctx, in, &ledger.ClaimOpts{Token: uuid.New()})
	require.ErrorIs(t, err, ledger.ErrInProgress, "another token waits for the live claim")
	_, err = l.Claim(ctx, in, nil)
	require.ErrorIs(t, err, ledger.ErrInProgress)

	// Once its lease ran out, the key is taken over like any other, token or not.
	b.clock.Advance(2 * time.Hour)
	taken, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour, Token: token})
	require.NoError(t, err)
	require.True(t, taken.Lease.Redrive)
	require.Equal(t, 2, taken.Lease.Attempt)

	_, err = l.Complete(ctx, again.Lease, ledger.Response{Body: []byte(`"done"`)})
	require.NoError(t, err, "the token still owns the record")
	replay, err := l.Claim(ctx, in, &ledger.ClaimOpts{Token: token})
	require.NoError(t, err)
	require.Nil(t, replay.Lease)
	require.True(t, replay.Result.Replayed)
	require.Equal(t, `"done"`, string(replay.Result.Body))
}

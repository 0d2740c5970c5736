package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// The dispatcher records a publication and the answer to that commit is lost after it
// became durable: the dispatcher reports an unknown outcome, never a lost lease of its
// own making; the send it retries says that the events it no longer owns may have been
// recorded by the lost one; and the event is published once.
func TestDispatcher_OutcomesCommittedThenFatalAreUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.produce(t, "acct-1", 100)
	h := pgtest.NewHeld(t, b.schema)
	out, err := outbox.New(h.Pool, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	var mu sync.Mutex
	var reported []error
	publications := 0
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		publications++
		return nil
	}), &outbox.DispatcherConfig{ErrorFunc: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err)
	}})
	require.NoError(t, err)

	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Release(ctx, t, 10*time.Second)   // the claim commits
		h.Terminate(ctx, t, 10*time.Second) // the publication's record commits, its answer is lost
		// The record sent again touches no row, so its commit is not held.
	}()
	_, err = d.DispatchOnce(ctx)
	<-done
	var lost *outbox.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.True(t, lost.AfterLostAnswer, "a lease lost after a lost answer says so")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, publications)
	require.NotEmpty(t, reported)
	require.True(t, errors.Is(reported[0], ledger.ErrOutcomeUnknown), "reported: %v", reported[0])

	var state string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT state FROM outbox_events`).Scan(&state))
	require.Equal(t, "published", state)
}

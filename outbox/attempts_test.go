package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/outbox"
)

// Event.Attempts and MaxAttempts count failed publications: a publication that outlives
// PublishTimeout is one, even when its publisher returns nil afterwards; a publication
// cut short by the dispatcher's stop is not, and its event is handed on with the
// attempts it had.
func TestDispatcher_AttemptsCountFailedPublications(t *testing.T) {
	t.Parallel()

	// row reads what the dispatchers left of an event.
	row := func(t *testing.T, b *bundle, id uuid.UUID) (state string, attempts int, locked bool) {
		t.Helper()
		var by pgtype.UUID
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT state, attempts, locked_by FROM outbox_events WHERE id = $1`, id).Scan(&state, &attempts, &by))
		return state, attempts, by.Valid
	}
	// handedOn publishes what is ready and returns the Attempts each event was handed on with.
	handedOn := func(t *testing.T, b *bundle) map[uuid.UUID]int {
		t.Helper()
		var mu sync.Mutex
		seen := map[uuid.UUID]int{}
		b.drain(t, b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen[e.ID] = e.Attempts
			return nil
		}), &outbox.DispatcherConfig{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond}))
		return seen
	}

	t.Run("StopIsNotAFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.produce(t, "acc-1", 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan struct{})
		d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, _ outbox.Event) error {
			close(started)
			<-ctx.Done() // a publication that lasts until the stop
			return ctx.Err()
		}), &outbox.DispatcherConfig{MaxAttempts: 1, PollInterval: 10 * time.Millisecond})
		stopped := make(chan error, 1)
		go func() { stopped <- d.Run(ctx) }()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the dispatcher did not start the publication")
		}
		cancel()
		select {
		case err := <-stopped:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after its context was cancelled")
		}

		state, attempts, locked := row(t, b, id)
		require.Equal(t, "pending", state, "with MaxAttempts 1, a stop counted as a failure would kill the event")
		require.Zero(t, attempts, "a publication cut short by a stop is not a failed publication")
		require.False(t, locked, "a stopping dispatcher releases its batch at once")
		require.Equal(t, map[uuid.UUID]int{id: 0}, handedOn(t, b))
	})

	t.Run("NilWithinGraceIsPublished", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.produce(t, "acc-1", 1)
		// The publisher answers success just after its deadline, within the grace the
		// dispatcher gives it (an eighth of Lease): the event arrived, and is not
		// published again.
		d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, _ outbox.Event) error {
			<-ctx.Done()
			return nil
		}), &outbox.DispatcherConfig{PublishTimeout: 50 * time.Millisecond, Lease: 2 * time.Second})
		n, err := d.DispatchOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		state, attempts, _ := row(t, b, id)
		require.Equal(t, "published", state)
		require.Equal(t, 1, attempts)
	})

	t.Run("LateNilIsAFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.produce(t, "acc-1", 1)
		// The publisher ignores its context and returns nil once the dispatcher has given
		// up on it (it reports the timeout to ErrorFunc before recording it).
		abandoned := make(chan struct{})
		var once sync.Once
		d := b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
			<-abandoned
			return nil
		}), &outbox.DispatcherConfig{PublishTimeout: 50 * time.Millisecond, Lease: time.Second,
			BackoffMin: time.Millisecond, BackoffMax: time.Millisecond,
			ErrorFunc: func(error) { once.Do(func() { close(abandoned) }) }})
		n, err := d.DispatchOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)

		state, attempts, _ := row(t, b, id)
		require.Equal(t, "pending", state)
		require.Equal(t, 1, attempts, "a publication that outlived PublishTimeout is a failed publication")
		// The backoff is a millisecond: the event is ready again at once, or very soon.
		var seen map[uuid.UUID]int
		require.Eventually(t, func() bool { seen = handedOn(t, b); return len(seen) > 0 }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, map[uuid.UUID]int{id: 1}, seen)
	})
}

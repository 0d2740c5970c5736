package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/outbox"
)

// killAll makes every pending event dead: its publisher refuses each permanently.
func (b *bundle) killAll(t *testing.T) {
	t.Helper()
	d := b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return outbox.ErrPermanent }), nil)
	b.drain(t, d)
}

func (b *bundle) enqueue(t *testing.T, topic string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: topic, Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return ids[0]
}

// Dead events are listed by topic, retried by topic or all at once, and a retry naming
// an event that is not dead retries nothing.
func TestOutbox_RetryDeadIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a1, a2, c1 := b.enqueue(t, "a"), b.enqueue(t, "a"), b.enqueue(t, "c")
	b.killAll(t)
	live := b.enqueue(t, "a")

	dead, err := b.out.ListDead(ctx, &outbox.DeadOpts{Topic: "a"})
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, a1, dead[0].ID)

	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{a1, live}})
	var nd *outbox.NotDeadError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, []uuid.UUID{live}, nd.IDs)
	still, err := b.out.ListDead(ctx, nil)
	require.NoError(t, err)
	require.Len(t, still, 3, "nothing was retried")

	ids, err := b.out.RetryDead(ctx, &outbox.RetryDeadOpts{Topic: "a"})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{a1, a2}, ids, "in their order")
	e, err := b.out.Get(ctx, a1)
	require.NoError(t, err)
	require.Equal(t, outbox.StatePending, e.State)
	require.Equal(t, 0, e.Attempts)

	ids, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{All: true})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{c1}, ids)
	ids, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{All: true})
	require.NoError(t, err)
	require.Empty(t, ids)

	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{All: true, Topic: "a"})
	require.Error(t, err)
	_, err = b.out.Get(ctx, uuid.New())
	require.ErrorIs(t, err, outbox.ErrEventNotFound)
}

// An ID named twice is one event to retry: RetryDead retries it once, beside the
// others, instead of refusing them all with a NotDeadError that names no event.
func TestOutbox_RetryDeadRepeatedID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	d1, d2 := b.enqueue(t, "a"), b.enqueue(t, "a")
	b.killAll(t)
	ids, err := b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{d2, d1, d2}})
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{d1, d2}, ids, "each once, in the outbox's order")
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 2}, st)

	live := b.enqueue(t, "a")
	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{live, live}})
	var nd *outbox.NotDeadError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, []uuid.UUID{live}, nd.IDs, "named once")
	require.Equal(t, 1, nd.Count)
}

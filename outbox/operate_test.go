package outbox_test

import (
	"context"
	"testing"
	"time"

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
	rec, err := b.out.Get(ctx, a1)
	require.NoError(t, err)
	require.Equal(t, outbox.StateDead, rec.State)

	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{a1, live}})
	var nd *outbox.NotDeadError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, []uuid.UUID{live}, nd.IDs)
	still, err := b.out.ListDead(ctx, nil)
	require.NoError(t, err)
	require.Len(t, still, 3, "nothing was retried")
	many := make([]uuid.UUID, outbox.MaxRetryDead+1)
	for i := range many {
		many[i] = uuid.New()
	}
	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: many})
	require.ErrorContains(t, err, "more than MaxRetryDead", "a retry of more events is refused before anything is sent")

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

// A retry names the events no outbox holds apart from those that are not dead, and each
// event retried keeps an audit row with who, why and how it died, which ListAudit reads
// back newest first.
func TestOutbox_RetryDeadAuditAndMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	d1, d2, d3 := b.enqueue(t, "a"), b.enqueue(t, "a"), b.enqueue(t, "c")
	b.killAll(t)
	live, absent := b.enqueue(t, "a"), uuid.New()

	_, err := b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{d1, live, absent}})
	var nd *outbox.NotDeadError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, 2, nd.Count)
	require.ElementsMatch(t, []uuid.UUID{live, absent}, nd.IDs)
	require.Equal(t, []uuid.UUID{absent}, nd.Missing)
	require.Equal(t, 1, nd.MissingCount)
	require.Contains(t, err.Error(), "1 of them do not exist")
	entries, err := b.out.ListAudit(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing retried, nothing audited")

	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{d1}, Actor: "alice", Reason: "INC-5: broker fixed"})
	require.NoError(t, err)
	_, err = b.out.RetryDead(ctx, &outbox.RetryDeadOpts{Topic: "c", Actor: "bob", Reason: "INC-6"})
	require.NoError(t, err)
	entries, err = b.out.ListAudit(ctx, nil)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, d3, entries[0].EventID, "newest first")
	first := entries[1]
	require.Equal(t, d1, first.EventID)
	require.Equal(t, "a", first.Topic)
	require.Equal(t, outbox.ActionRetry, first.Action)
	require.Equal(t, "alice", first.Actor)
	require.Equal(t, "INC-5: broker fixed", first.Reason)
	require.NotEmpty(t, first.DBUser)
	require.Positive(t, first.Attempts, "as it was when dead")
	require.NotEmpty(t, first.LastError)

	for opts, want := range map[*outbox.AuditOpts][]uuid.UUID{
		{EventID: d1}:                         {d1},
		{Topic: "c"}:                          {d3},
		{Actor: "alice"}:                      {d1},
		{Limit: 1}:                            {d3},
		{Since: entries[0].At.Add(time.Hour)}: {},
		{Until: entries[0].At}:                {d1},
		{EventID: d2}:                         {},
	} {
		got, err := b.out.ListAudit(ctx, opts)
		require.NoError(t, err)
		ids := []uuid.UUID{}
		for _, e := range got {
			ids = append(ids, e.EventID)
		}
		require.Equal(t, want, ids, "%+v", opts)
	}
	_, err = b.out.ListAudit(ctx, &outbox.AuditOpts{Limit: -1})
	require.Error(t, err)
}

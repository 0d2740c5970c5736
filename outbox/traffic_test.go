package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/outbox"
)

// waitFor polls cond until it holds or the bound passes.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *bundle) published(t *testing.T) int {
	st, err := b.out.Stats(context.Background())
	require.NoError(t, err)
	return st.Published
}

// run starts d.Run and stops it at cleanup.
func run(t *testing.T, d *outbox.Dispatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// More dispatchers than pool connections still publish everything: listening does not
// take the dispatching pool's connections.
func TestDispatcher_MoreDispatchersThanConnections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small := pgtest.Pool(t, b.schema, func(c *pgxpool.Config) { c.MaxConns = 4 })
	out, err := outbox.New(small, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	for i := range 40 {
		b.produce(t, "acc", int64(i))
	}
	for range 4 {
		d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }),
			&outbox.DispatcherConfig{BatchSize: 5, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		run(t, d)
	}
	waitFor(t, 20*time.Second, "40 events published by 4 dispatchers on 4 connections", func() bool { return b.published(t) == 40 })
}

// A dispatcher that cannot get a connection says so through ErrorFunc instead of
// waiting silently.
func TestDispatcher_ReportsMissingConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tiny := pgtest.Pool(t, b.schema, func(c *pgxpool.Config) { c.MaxConns = 1 })
	out, err := outbox.New(tiny, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	held, err := tiny.Acquire(context.Background())
	require.NoError(t, err)
	defer held.Release()
	reported := make(chan error, 10)
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }),
		&outbox.DispatcherConfig{AcquireTimeout: 100 * time.Millisecond, ErrorFunc: func(err error) {
			select {
			case reported <- err:
			default:
			}
		}})
	require.NoError(t, err)
	run(t, d)
	select {
	case err := <-reported:
		require.ErrorContains(t, err, "connection")
	case <-time.After(10 * time.Second):
		t.Fatal("no error reported while the pool had no connection to give")
	}
}

// A consumer that accepts a publication and never answers holds up one event for at
// most the publication deadline; the rest of the batch, and the event itself on a
// later attempt, are published.
func TestDispatcher_HungConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var hung atomic.Bool
	release := make(chan struct{})
	var got sync.Map
	consumer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.CompareAndSwap(false, true) {
			select { // the first publication: never answered (until the test ends)
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		got.Store(strings.Trim(r.Header.Get("Idempotency-Key"), `"`), true)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer consumer.Close()
	defer close(release)
	ids := map[uuid.UUID]bool{}
	for i := range 20 {
		ids[b.produce(t, "acc", int64(i))] = true
	}
	for range 2 {
		d := b.dispatcher(t, outbox.HTTPPublisher(nil, consumer.URL), &outbox.DispatcherConfig{
			BatchSize: 20, PublishTimeout: 300 * time.Millisecond, BackoffMin: 10 * time.Millisecond, PollInterval: 50 * time.Millisecond})
		run(t, d)
	}
	waitFor(t, 15*time.Second, "every event published past a hung consumer", func() bool { return b.published(t) == 20 })
	for id := range ids {
		_, ok := got.Load(id.String())
		require.True(t, ok, "event %s reached the consumer", id)
	}
}

// An ordered backlog drains without waiting for the poll interval between events.
func TestDispatcher_OrderedBacklogDrains(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 50 {
		b.produce(t, "one-key", int64(i))
	}
	var mu sync.Mutex
	var order []int64
	d := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, int64(len(order)))
		return nil
	}), &outbox.DispatcherConfig{Ordered: true, PollInterval: time.Minute})
	run(t, d)
	waitFor(t, 10*time.Second, "50 events of one key published with a one-minute poll interval", func() bool { return b.published(t) == 50 })
}

// The backoff of a failed publication counts from the failure, not from the start of
// its batch.
func TestDispatcher_BackoffFromFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.produce(t, "acc", 1)
	var failedAt time.Time
	d := b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		time.Sleep(1500 * time.Millisecond) // a slow consumer
		failedAt = time.Now()
		return errors.New("unavailable")
	}), &outbox.DispatcherConfig{BackoffMin: time.Second})
	_, err := d.DispatchOnce(context.Background())
	require.NoError(t, err)
	var availableAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT available_at FROM outbox_events WHERE id = $1`, id).Scan(&availableAt))
	require.False(t, availableAt.Before(failedAt.Add(900*time.Millisecond)),
		"available at %s, failed at %s: the backoff must count from the failure", availableAt, failedAt)
}

// Stopping Run records what it already published; nothing published is published again
// because of the stop.
func TestDispatcher_StopKeepsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.produce(t, "acc", int64(i))
	}
	var n atomic.Int32
	third := make(chan struct{})
	d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		if n.Add(1) == 3 {
			close(third)
			<-ctx.Done() // hangs until the dispatcher stops
			return ctx.Err()
		}
		return nil
	}), &outbox.DispatcherConfig{BatchSize: 5, PublishTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	<-third
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, 2, b.published(t), "the two events published before the stop are recorded")
	var leased int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox_events WHERE state = 'pending' AND locked_until > now()`).Scan(&leased))
	require.Equal(t, 0, leased, "the rest are free for the next dispatcher at once")
}

// Enqueue checks its limits before any SQL and answers a reused event ID with a typed
// error; neither leaves the caller's transaction aborted.
func TestEnqueue_TypedErrorsAndLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := uuid.New()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = b.out.Enqueue(ctx, tx, outbox.Event{ID: id, Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	for name, e := range map[string]outbox.Event{
		"ReusedID":         {ID: id, Topic: "t", Payload: []byte(`{}`)},
		"LongOrderingKey":  {Topic: "t", OrderingKey: strings.Repeat("k", outbox.MaxOrderingKeyLen+1)},
		"NULInTopic":       {Topic: "t\x00"},
		"InvalidUTF8Key":   {Topic: "t", OrderingKey: "\xff"},
		"LongTopic":        {Topic: strings.Repeat("t", outbox.MaxTopicLen+1)},
		"NULInOrderingKey": {Topic: "t", OrderingKey: "a\x00"},
	} {
		_, err := b.out.Enqueue(ctx, tx, e)
		require.Error(t, err, name)
		var pgErr *pgconn.PgError
		require.False(t, errors.As(err, &pgErr), "%s: a raw PostgreSQL error: %v", name, err)
		if name == "ReusedID" {
			require.ErrorIs(t, err, outbox.ErrDuplicateEvent)
		} else {
			require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
		}
		_, err = tx.Exec(ctx, "SELECT 1")
		require.NoError(t, err, "%s: the caller's transaction is usable", name)
	}
	_, err = b.out.Enqueue(ctx, tx, outbox.Event{Topic: "t", OrderingKey: strings.Repeat("k", outbox.MaxOrderingKeyLen), Payload: []byte(`{}`)})
	require.NoError(t, err, "the longest ordering key fits the index")
	require.NoError(t, tx.Commit(ctx))
	var count int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&count))
	require.Equal(t, 2, count)
}

// Producers of one ordering key take turns from Enqueue to commit, so the outbox order
// of a key is its commit order.
func TestEnqueue_ProducersOfOneKeyTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx)
	_, err = b.out.Enqueue(ctx, first, outbox.Event{Topic: "t", OrderingKey: "k", Payload: []byte(`"first"`)})
	require.NoError(t, err)
	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: "t", OrderingKey: "k", Payload: []byte(`"second"`)})
			return err
		})
	}()
	select {
	case err := <-second:
		t.Fatalf("the second producer of key k enqueued while the first was open (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-second)
	var payloads []string
	rows, err := b.pool.Query(ctx, `SELECT convert_from(payload, 'UTF8') FROM outbox_events WHERE ordering_key = 'k' ORDER BY seq`)
	require.NoError(t, err)
	payloads, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{`"first"`, `"second"`}, payloads)
}

// A dead event that is retried is published after the events of its key that overtook
// it while it was dead.
func TestDispatcher_RetriedDeadEventComesAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ids := []uuid.UUID{b.produce(t, "k", 0), b.produce(t, "k", 1), b.produce(t, "k", 2)}
	var order []uuid.UUID
	fail := true
	d := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.ID == ids[0] && fail {
			return fmt.Errorf("bad: %w", outbox.ErrPermanent)
		}
		order = append(order, e.ID)
		return nil
	}), &outbox.DispatcherConfig{Ordered: true})
	b.drain(t, d)
	require.Equal(t, []uuid.UUID{ids[1], ids[2]}, order, "the dead head no longer holds its key back")
	fail = false
	ok, err := b.out.Retry(ctx, ids[0])
	require.NoError(t, err)
	require.True(t, ok)
	b.drain(t, d)
	require.Equal(t, []uuid.UUID{ids[1], ids[2], ids[0]}, order)
}

// The HTTP publisher fails a topic that cannot be a header value at once, as permanent,
// and labels what it sends by what it is.
func TestHTTPPublisher_TopicAndContentType(t *testing.T) {
	t.Parallel()
	var types sync.Map
	calls := atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		types.Store(r.Header.Get("X-Event-Topic"), r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	pub := outbox.HTTPPublisher(nil, srv.URL)
	ctx := context.Background()
	err := pub.Publish(ctx, outbox.Event{ID: uuid.New(), Topic: "bad\ntopic", Payload: []byte(`{}`)})
	require.ErrorIs(t, err, outbox.ErrPermanent)
	require.Equal(t, int32(0), calls.Load(), "nothing was sent")
	require.NoError(t, pub.Publish(ctx, outbox.Event{ID: uuid.New(), Topic: "json", Payload: []byte(`{"a":1}`)}))
	require.NoError(t, pub.Publish(ctx, outbox.Event{ID: uuid.New(), Topic: "bytes", Payload: []byte{0xff, 0x00}}))
	ct, _ := types.Load("json")
	require.Equal(t, "application/json", ct)
	ct, _ = types.Load("bytes")
	require.Equal(t, "application/octet-stream", ct)
}

// ErrorFunc is never called from two goroutines at once, even while the listener and
// the dispatch loop both hit errors: an unsynchronised ErrorFunc is safe (run under
// -race).
func TestDispatcher_ErrorFuncSerialised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 20 {
		b.produce(t, "acc", int64(i))
	}
	var seen []string // deliberately unsynchronised
	d := b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		return errors.New("down")
	}), &outbox.DispatcherConfig{BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, MaxAttempts: 1000,
		PollInterval: 5 * time.Millisecond, ErrorFunc: func(err error) { seen = append(seen, err.Error()) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(ctx)
	}()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		// Kill the listener's connection, so the listener reports too.
		_, _ = b.pool.Exec(context.Background(),
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`)
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	require.NotEmpty(t, seen)
}

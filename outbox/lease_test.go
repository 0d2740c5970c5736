package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// flight watches publications: it records a publication that starts while another of
// its ordering key (or, without a key, of its event) is in flight, and the successful
// ones in the order they ended.
type flight struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps []string
	done     []uuid.UUID
}

func (f *flight) wrap(pub outbox.PublisherFunc) outbox.PublisherFunc {
	return func(ctx context.Context, e outbox.Event) error {
		k := e.OrderingKey
		if k == "" {
			k = e.ID.String()
		}
		f.mu.Lock()
		if f.inFlight == nil {
			f.inFlight = map[string]int{}
		}
		if f.inFlight[k] > 0 {
			f.overlaps = append(f.overlaps, fmt.Sprintf("%s started while %s had a publication in flight", e.ID, k))
		}
		f.inFlight[k]++
		f.mu.Unlock()
		err := pub(ctx, e)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.inFlight[k]--
		if err == nil {
			f.done = append(f.done, e.ID)
		}
		return err
	}
}

func (f *flight) check(t *testing.T) []uuid.UUID {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.overlaps, "publications of one key overlapped")
	return append([]uuid.UUID(nil), f.done...)
}

// slow is a consumer that takes d, honouring its context.
func slow(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func account(e outbox.Event) string {
	var tr transfer
	_ = json.Unmarshal(e.Payload, &tr)
	return tr.Account
}

// Ordered, PublishTimeout 1 s, Lease 2 s: the first event of key k fails for good, so
// the rest of k is held back while six 600 ms events of other keys follow, longer than
// the lease. The held-back events go back to the outbox with the failure; a second
// dispatcher publishes them, and no publication of k ever starts while another is in
// flight.
func TestDispatcher_HeldBackEventsAreReleasedWithTheFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k1, k2, k3 := b.produce(t, "k", 1), b.produce(t, "k", 2), b.produce(t, "k", 3)
	for i := range 6 {
		b.produce(t, fmt.Sprintf("slow-%d", i), int64(i))
	}
	var f flight
	var failed atomic.Bool
	firstFailed := make(chan struct{})
	pub := f.wrap(func(ctx context.Context, e outbox.Event) error {
		switch {
		case e.ID == k1 && failed.CompareAndSwap(false, true):
			close(firstFailed)
			return fmt.Errorf("refused: %w", outbox.ErrPermanent)
		case account(e) == "k":
			return slow(ctx, 900*time.Millisecond)
		default:
			return slow(ctx, 600*time.Millisecond)
		}
	})
	cfg := &outbox.DispatcherConfig{Ordered: true, PublishTimeout: time.Second, Lease: 2 * time.Second, BatchSize: 9,
		PollInterval: 20 * time.Millisecond, BackoffMin: 10 * time.Millisecond}
	first := b.dispatcher(t, pub, cfg)
	second := b.dispatcher(t, pub, cfg)
	go func() {
		<-firstFailed
		run(t, second)
	}()
	ctx := context.Background()
	n, err := first.DispatchOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 9, n)
	waitFor(t, 30*time.Second, "k2 and k3 published", func() bool {
		_, err := first.DispatchOnce(ctx)
		require.NoError(t, err)
		var left int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE id IN ($1, $2) AND state <> 'published'`, k2, k3).Scan(&left))
		return left == 0
	})
	done := f.check(t)
	var order []uuid.UUID
	for _, id := range done {
		if id == k2 || id == k3 {
			order = append(order, id)
		}
	}
	require.Equal(t, []uuid.UUID{k2, k3}, order, "each once, in order")
}

// Two ordered dispatchers: k1 goes dead, k2 is being published by the second one, and
// k1 is retried. The first dispatcher does not publish k1 before k2 finishes: a retried
// event is enqueued anew, after the events of its key in flight.
func TestDispatcher_RetriedDeadEventWaitsForItsKeyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k1, k2 := b.produce(t, "k", 1), b.produce(t, "k", 2)
	var f flight
	var failed atomic.Bool
	k2Started, releaseK2 := make(chan struct{}), make(chan struct{})
	pub := f.wrap(func(ctx context.Context, e outbox.Event) error {
		switch e.ID {
		case k1:
			if failed.CompareAndSwap(false, true) {
				return fmt.Errorf("refused: %w", outbox.ErrPermanent)
			}
		case k2:
			close(k2Started)
			select {
			case <-releaseK2:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	cfg := &outbox.DispatcherConfig{Ordered: true, BatchSize: 1, PublishTimeout: time.Minute}
	first, second := b.dispatcher(t, pub, cfg), b.dispatcher(t, pub, cfg)
	_, err := first.DispatchOnce(ctx)
	require.NoError(t, err)
	dead, err := b.out.Dead(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)

	secondDone := make(chan error, 1)
	go func() {
		_, err := second.DispatchOnce(ctx)
		secondDone <- err
	}()
	<-k2Started
	ok, err := b.out.Retry(ctx, k1)
	require.NoError(t, err)
	require.True(t, ok)
	n, err := first.DispatchOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "k1 waits while k2 is in flight")
	close(releaseK2)
	require.NoError(t, <-secondDone)
	b.drain(t, first)
	require.Equal(t, []uuid.UUID{k2, k1}, f.check(t))
}

// A dispatcher whose pool is starved past its lease comes back to find its events
// claimed by another dispatcher: its renewal and its outcomes touch none of them, it
// publishes none of them, and it drops the rest of its batch with ErrLeaseLost.
func TestDispatcher_LapsedLeaseIsNotRenewedOverAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ids []uuid.UUID
	for i := range 5 {
		ids = append(ids, b.produce(t, "k", int64(i)))
	}
	starved := pgtest.Pool(t, b.schema, func(c *pgxpool.Config) { c.MaxConns = 1 })
	starvedOut, err := outbox.New(starved, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	var f flight
	var held *pgxpool.Conn
	var release sync.Once
	starving := make(chan struct{})
	cfg := &outbox.DispatcherConfig{Ordered: true, BatchSize: 5, PublishTimeout: time.Second, Lease: 2 * time.Second,
		AcquireTimeout: time.Minute, PollInterval: 20 * time.Millisecond}
	first, err := outbox.NewDispatcher(starvedOut, f.wrap(func(ctx context.Context, e outbox.Event) error {
		if e.ID == ids[1] && held == nil {
			// From here on the first dispatcher gets no connection.
			c, err := starved.Acquire(ctx)
			if err != nil {
				return err
			}
			held = c
			close(starving)
		}
		return slow(ctx, 900*time.Millisecond)
	}), cfg)
	require.NoError(t, err)
	second := b.dispatcher(t, f.wrap(func(ctx context.Context, e outbox.Event) error {
		// The second dispatcher has claimed the first's events: give the first its
		// connection back while this publication is in flight.
		release.Do(func() { held.Release() })
		return slow(ctx, 300*time.Millisecond)
	}), cfg)
	go func() {
		<-starving
		run(t, second)
	}()
	_, dispatchErr := first.DispatchOnce(ctx)
	waitFor(t, 30*time.Second, "every event published", func() bool { return b.published(t) == len(ids) })
	f.check(t)
	require.ErrorIs(t, dispatchErr, outbox.ErrLeaseLost)
	var lost *outbox.LeaseLostError
	require.ErrorAs(t, dispatchErr, &lost)
	require.Positive(t, lost.Events)
}

// BackoffMin = BackoffMax = 100 ms, and the first event of a batch of twenty fails: the
// failure is recorded at once, and another dispatcher publishes the event again while
// the first one's batch goes on.
func TestDispatcher_FailedEventIsFreeWhenItsBackoffEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []uuid.UUID
	for i := range 20 {
		ids = append(ids, b.produce(t, fmt.Sprintf("acc-%d", i), int64(i)))
	}
	var failed atomic.Bool
	started := make(chan struct{})
	republished := make(chan struct{})
	var inTime atomic.Bool
	cfg := &outbox.DispatcherConfig{BackoffMin: 100 * time.Millisecond, BackoffMax: 100 * time.Millisecond, BatchSize: 20,
		PollInterval: 10 * time.Millisecond}
	first := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		switch e.ID {
		case ids[0]:
			if failed.CompareAndSwap(false, true) {
				close(started)
				return errors.New("unavailable")
			}
		case ids[len(ids)-1]:
			// The batch's last event: by now the failed one should be published again
			// by the other dispatcher, which has nothing else to do.
			select {
			case <-republished:
				inTime.Store(true)
			case <-time.After(5 * time.Second):
			}
		default:
			return slow(ctx, 50*time.Millisecond)
		}
		return nil
	}), cfg)
	second := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.ID == ids[0] {
			close(republished)
		}
		return nil
	}), cfg)
	go func() {
		<-started
		run(t, second)
	}()
	_, err := first.DispatchOnce(context.Background())
	require.NoError(t, err)
	require.True(t, inTime.Load(), "the failed event was published again while the first dispatcher's batch went on")
}

// The lease rule is explicit: a lease shorter than twice PublishTimeout is refused, and
// the default lease grows with a long PublishTimeout.
func TestNewDispatcher_LeaseRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil })
	for name, cfg := range map[string]*outbox.DispatcherConfig{
		"ShorterThanTwicePublishTimeout": {PublishTimeout: 10 * time.Second, Lease: 15 * time.Second},
		"ShorterThanTwiceTheDefault":     {Lease: 19 * time.Second},
		"Negative":                       {BatchSize: -1},
	} {
		_, err := outbox.NewDispatcher(b.out, pub, cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
	_, err := outbox.NewDispatcher(b.out, pub, &outbox.DispatcherConfig{PublishTimeout: time.Minute})
	require.NoError(t, err, "the default lease is twice a long PublishTimeout")
	_, err = outbox.NewDispatcher(b.out, pub, &outbox.DispatcherConfig{PublishTimeout: time.Second, Lease: 2 * time.Second})
	require.NoError(t, err)
}

// Every publication starts with at least PublishTimeout and a margin of its lease left,
// as the database sees it: the dispatcher renews before a publication, not after the
// last one that fitted.
func TestDispatcher_PublicationStartsWithLeaseToSpare(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 4 {
		b.produce(t, fmt.Sprintf("acc-%d", i), int64(i))
	}
	const publishTimeout, lease = time.Second, 2 * time.Second
	var mu sync.Mutex
	var left []time.Duration
	d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		var ms float64
		if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM locked_until - now()) * 1000 FROM outbox_events WHERE id = $1`, e.ID).Scan(&ms); err != nil {
			return err
		}
		mu.Lock()
		left = append(left, time.Duration(ms*float64(time.Millisecond)))
		mu.Unlock()
		return slow(ctx, 900*time.Millisecond)
	}), &outbox.DispatcherConfig{PublishTimeout: publishTimeout, Lease: lease, BatchSize: 4})
	b.drain(t, d)
	require.Len(t, left, 4)
	for i, l := range left {
		require.GreaterOrEqual(t, l, publishTimeout+lease/8, "publication %d started with %s of its lease left", i, l)
	}
}

// Two producers enqueue the same ordering keys in opposite order across separate
// Enqueue calls and wait for each other: PostgreSQL aborts one, and Enqueue says so with
// a typed, retryable error; the other commits.
func TestEnqueue_OppositeKeyOrderDeadlockIsTyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	enqueue := func(tx pgx.Tx, key string) error {
		_, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: "t", OrderingKey: key, Payload: []byte(`{}`)})
		return err
	}
	tx1, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	tx2, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	require.NoError(t, enqueue(tx1, "a"))
	require.NoError(t, enqueue(tx2, "b"))
	// Each producer that PostgreSQL aborts rolls back at once, as a retry loop would,
	// which lets the other go on.
	type outcome struct {
		tx  pgx.Tx
		err error
	}
	done := make(chan outcome, 2)
	for _, p := range []struct {
		tx  pgx.Tx
		key string
	}{{tx1, "b"}, {tx2, "a"}} {
		go func() {
			err := enqueue(p.tx, p.key)
			if err != nil {
				_ = p.tx.Rollback(ctx)
			}
			done <- outcome{p.tx, err}
		}()
	}
	var err1 error
	var other pgx.Tx
	for range 2 {
		select {
		case o := <-done:
			if o.err != nil {
				require.Nil(t, err1, "only one producer is aborted")
				err1 = o.err
			} else {
				other = o.tx
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no deadlock reported")
		}
	}
	require.Error(t, err1, "one producer was aborted")
	require.NotNil(t, other, "the other went on")
	require.ErrorIs(t, err1, outbox.ErrOrderingKeyDeadlock)
	var de *outbox.OrderingKeyDeadlockError
	require.ErrorAs(t, err1, &de)
	require.Equal(t, "40P01", de.SQLState())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err1, &pgErr, "the PostgreSQL error is in the chain, for retry loops that look for it")
	require.Contains(t, err1.Error(), "run it again")
	require.NoError(t, other.Commit(ctx))
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Pending, "the other producer's two events")
}

// An ordered claim takes no event behind an earlier event of its key that another
// transaction has locked (as a dispatcher recording that event's outcome does): SKIP
// LOCKED passes over the row, and the events behind it wait with it.
func TestDispatcher_OrderedClaimTakesNothingBehindALockedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e1, e2 := b.produce(t, "k", 1), b.produce(t, "k", 2)
	other := b.produce(t, "other", 3)
	var f flight
	d := b.dispatcher(t, f.wrap(func(context.Context, outbox.Event) error { return nil }), &outbox.DispatcherConfig{Ordered: true})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE`, e1)
	require.NoError(t, err)
	n, err := d.DispatchOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the other key's event")
	require.NoError(t, tx.Rollback(ctx))
	b.drain(t, d)
	require.Equal(t, []uuid.UUID{other, e1, e2}, f.check(t))
}

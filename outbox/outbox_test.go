package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) {
	// A child process of TestHistoryOutbox runs a dispatcher until it is killed.
	testsuite.RunWorkerProcess(map[string]testsuite.WorkerMain{historyChild: runHistoryChild})
	pgtest.Main(m)
}

type bundle struct {
	pool   *pgxpool.Pool
	schema string
	out    *outbox.Outbox
	in     *inbox.Inbox
}

// transfersDDL is the business tables of the tests: the producer's transfers, and the
// consumer's statement lines.
const transfersDDL = `
	CREATE TABLE transfers (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL);
	CREATE TABLE statements (id bigserial PRIMARY KEY, event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL)`

func setup(t *testing.T) *bundle {
	t.Helper()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up), transfersDDL)
	out, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	in, err := inbox.New(pool, &inbox.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, out: out, in: in}
}

type transfer struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// produce commits a business write and its event in one transaction.
func (b *bundle) produce(t testing.TB, account string, amount int64) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transfers (account, amount) VALUES ($1, $2)`, account, amount); err != nil {
			return err
		}
		payload, _ := json.Marshal(transfer{Account: account, Amount: amount})
		ids, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: "transfers", OrderingKey: account, Payload: payload})
		if err == nil {
			id = ids[0]
		}
		return err
	}))
	return id
}

// consume is the consumer: it books the statement line once per event, through its
// inbox keyed by the event ID.
func (b *bundle) consume(ctx context.Context, e outbox.Event) error {
	_, err := b.in.Handle(ctx, "statements", e.ID.String(), func(ctx context.Context, tx pgx.Tx) error {
		var tr transfer
		if err := json.Unmarshal(e.Payload, &tr); err != nil {
			return ledger.Definitive("bad_event", err.Error())
		}
		_, err := tx.Exec(ctx, `INSERT INTO statements (event_id, account, amount) VALUES ($1, $2, $3)`, e.ID, tr.Account, tr.Amount)
		return err
	})
	return err
}

// withRetention is the bundle's outbox with another PublishedRetention.
func (b *bundle) withRetention(t testing.TB, d time.Duration) *outbox.Outbox {
	t.Helper()
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema, PublishedRetention: d})
	require.NoError(t, err)
	return out
}

func (b *bundle) dispatcher(t testing.TB, pub outbox.Publisher, cfg *outbox.DispatcherConfig) *outbox.Dispatcher {
	t.Helper()
	d, err := outbox.NewDispatcher(b.out, pub, cfg)
	require.NoError(t, err)
	return d
}

// drain dispatches until nothing is ready.
func (b *bundle) drain(t testing.TB, d *outbox.Dispatcher) {
	t.Helper()
	_, err := d.Drain(context.Background())
	require.NoError(t, err)
}

// A rolled-back business transaction leaves no event.
func TestOutbox_RolledBackTransactionLeavesNoEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: "transfers", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return errors.New("the business write failed")
	})
	require.Error(t, err)
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, st)
}

// The dispatcher publishes the same event more than once (it dies after publishing,
// before marking); the consumer's inbox makes the effect happen once.
func TestOutbox_PublishedTwiceConsumedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.produce(t, "acc-1", 500)
	var publishes atomic.Int32
	ctx, crash := context.WithCancel(context.Background())
	dying := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		publishes.Add(1)
		err := b.consume(context.Background(), e)
		crash() // the dispatcher dies before its transaction marks the event published
		return err
	}), nil)
	_, err := dying.DispatchOnce(ctx)
	require.Error(t, err)
	st, err := b.out.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, st.Pending, "the event is still pending")

	b.drain(t, b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		publishes.Add(1)
		return b.consume(ctx, e)
	}), nil))
	require.Equal(t, int32(2), publishes.Load(), "published twice")
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM statements WHERE event_id = $1`, id)
}

// End to end over HTTP: producer, outbox, dispatcher, HTTP publisher, consumer behind the
// Idempotency-Key middleware. The consumer commits and then crashes before answering
// (the ack is lost); the redelivery is recognised; the effect exists once.
func TestOutbox_EndToEndOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, err := ledger.New(b.pool, &ledger.Config{Schema: b.schema})
	require.NoError(t, err)
	mw, err := idempotency.New(&idempotency.Config{Ledger: l, TenantFunc: idempotency.FixedTenant("bank")})
	require.NoError(t, err)
	var dropped sync.Map
	consumer := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		var tr transfer
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		id := uuid.MustParse(key[1 : len(key)-1])
		if _, err := tx.Exec(r.Context(), `INSERT INTO statements (event_id, account, amount) VALUES ($1, $2, $3)`, id, tr.Account, tr.Amount); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(consumer.Close)
	// The network drops the first answer to every event, after the consumer committed.
	client := &http.Client{Transport: &dropFirstAnswer{seen: &dropped, next: http.DefaultTransport}}
	d := b.dispatcher(t, outbox.HTTPPublisher(client, consumer.URL), &outbox.DispatcherConfig{BackoffMin: time.Millisecond})
	var ids []uuid.UUID
	for i := range 20 {
		ids = append(ids, b.produce(t, fmt.Sprintf("acc-%d", i%3), int64(i)))
	}
	for range 50 {
		_, err := d.DispatchOnce(context.Background())
		require.NoError(t, err)
		if st, _ := b.out.Stats(context.Background()); st.Published == len(ids) {
			break
		}
		time.Sleep(5 * time.Millisecond) // let the millisecond backoff pass
	}
	st, err := b.out.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Published: 20}, st)
	testsuite.RequireCount(t.Context(), t, b.pool, 20, `SELECT count(DISTINCT event_id) FROM statements`)
	testsuite.RequireCount(t.Context(), t, b.pool, 20, `SELECT count(*) FROM statements`)
}

// dropFirstAnswer delivers each request but loses the first response for each
// Idempotency-Key, as a network that fails after the server committed.
type dropFirstAnswer struct {
	seen *sync.Map
	next http.RoundTripper
}

func (d *dropFirstAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if _, loaded := d.seen.LoadOrStore(r.Header.Get("Idempotency-Key"), true); !loaded {
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	}
	return resp, nil
}

// Three dispatchers at once never lose an event, and the consumer books each once.
func TestOutbox_ThreeDispatchersLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 600
	for i := range n {
		b.produce(t, fmt.Sprintf("acc-%d", i%7), int64(i))
	}
	var publishes atomic.Int32
	pub := outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		publishes.Add(1)
		return b.consume(ctx, e)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		d := b.dispatcher(t, pub, &outbox.DispatcherConfig{BatchSize: 25, PollInterval: 20 * time.Millisecond})
		wg.Go(func() { _ = d.Run(ctx) })
	}
	require.Eventually(t, func() bool {
		st, err := b.out.Stats(context.Background())
		return err == nil && st.Published == n
	}, time.Minute, 20*time.Millisecond)
	cancel()
	wg.Wait()
	require.Equal(t, int32(n), publishes.Load(), "SKIP LOCKED: no event went to two dispatchers")
	testsuite.RequireCount(t.Context(), t, b.pool, n, `SELECT count(DISTINCT event_id) FROM statements`)
}

// An event that keeps failing goes to the dead state; operators see it and retry it.
func TestOutbox_DeadLetterAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.produce(t, "acc-dead", 1)
	var healthy atomic.Bool
	d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		if !healthy.Load() {
			return errors.New("consumer down")
		}
		return b.consume(ctx, e)
	}), &outbox.DispatcherConfig{MaxAttempts: 3, BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	for range 50 {
		_, err := d.DispatchOnce(context.Background())
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
	}
	dead, err := b.out.Dead(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Equal(t, 3, dead[0].Attempts)
	require.Contains(t, dead[0].LastError, "consumer down")

	healthy.Store(true)
	ok, err := b.out.Retry(context.Background(), id)
	require.NoError(t, err)
	require.True(t, ok)
	b.drain(t, d)
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM statements WHERE event_id = $1`, id)
}

// With Ordered, a failing event holds back the later events of its key, and each key's
// events are published in enqueue order; other keys go on.
func TestOutbox_OrderPerKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.produce(t, "a", int64(i))
		b.produce(t, "b", int64(i))
	}
	var mu sync.Mutex
	order := map[string][]int64{}
	failedOnce := false
	d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		var tr transfer
		_ = json.Unmarshal(e.Payload, &tr)
		mu.Lock()
		defer mu.Unlock()
		if tr.Account == "a" && tr.Amount == 1 && !failedOnce {
			failedOnce = true
			return errors.New("hiccup")
		}
		order[tr.Account] = append(order[tr.Account], tr.Amount)
		return nil
	}), &outbox.DispatcherConfig{Ordered: true, BackoffMin: time.Millisecond})
	for range 100 {
		if _, err := d.DispatchOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st, _ := b.out.Stats(context.Background()); st.Published == 10 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	require.Equal(t, []int64{0, 1, 2, 3, 4}, order["a"])
	require.Equal(t, []int64{0, 1, 2, 3, 4}, order["b"])
}

func TestOutbox_BadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.out.Enqueue(ctx, nil, outbox.Event{Topic: "x"})
	require.Error(t, err)
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.out.Enqueue(ctx, tx, outbox.Event{})
		return err
	})
	require.ErrorContains(t, err, "no topic")
	_, err = outbox.NewDispatcher(b.out, nil, nil)
	require.Error(t, err)
}

// Purge deletes published events older than the retention, in batches, and leaves
// pending ones and newer ones.
func TestOutbox_Purge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for i := range 3 {
		b.produce(t, fmt.Sprintf("acc-p%d", i), 1)
	}
	b.drain(t, b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }), nil))
	pending := b.produce(t, "acc-pending", 1)
	n, err := b.out.Purgeable(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing was published longer ago than the default retention")
	res, err := b.out.Purge(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "nothing was published longer ago than the default retention")
	hour := b.withRetention(t, time.Hour)
	res, err = hour.Purge(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "nothing was published an hour ago")
	purger := b.withRetention(t, time.Nanosecond)
	n, err = purger.Purgeable(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	res, err = purger.Purge(ctx, &ledger.PurgeOpts{BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, ledger.PurgeResult{Deleted: 3, Batches: 2}, res)
	_, err = purger.Purge(ctx, &ledger.PurgeOpts{BatchSize: -1})
	require.Error(t, err, "negative options are refused")
	_, err = outbox.New(b.pool, &outbox.Config{Schema: b.schema, PublishedRetention: -time.Second})
	require.Error(t, err, "a negative retention is refused")
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 1}, st)
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM `+b.schema+`.outbox_events WHERE id = $1`, pending)
}

// A purge statement reads the oldest published events through their index: its plan
// has no sequential scan of the outbox even where sequential scans are priced out, so a
// purge of millions of events does not read the whole table once per batch.
func TestOutbox_PurgeReadsPublishedIndex(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("on Citus the plan is the node's, inside Citus's own scan, and the purge picks events by key")
	}
	b := setup(t)
	ctx := context.Background()
	var plan strings.Builder
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+outbox.PurgeSQL(b.out), 1000, time.Now())
		if err != nil {
			return err
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return err
			}
			plan.WriteString(line + "\n")
		}
		return rows.Err()
	}))
	require.Contains(t, plan.String(), "outbox_events_published_idx", plan.String())
	require.NotContains(t, plan.String(), "Seq Scan", plan.String())
}

// A purge with a pause waits between its statements and ends, with what it deleted so
// far, when its context is cancelled during a pause.
func TestOutbox_PurgePause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for i := range 5 {
		b.produce(t, fmt.Sprintf("acc-p%d", i), 1)
	}
	b.drain(t, b.dispatcher(t, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }), nil))
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		res ledger.PurgeResult
		err error
	}
	done := make(chan outcome, 1)
	purger := b.withRetention(t, time.Nanosecond)
	go func() {
		res, err := purger.Purge(pctx, &ledger.PurgeOpts{BatchSize: 2, Pause: time.Hour})
		done <- outcome{res, err}
	}()
	require.Eventually(t, func() bool {
		st, err := b.out.Stats(ctx)
		return err == nil && st.Published == 3
	}, 30*time.Second, 10*time.Millisecond, "the first statement deletes 2 of 5")
	cancel()
	select {
	case o := <-done:
		require.ErrorIs(t, o.err, context.Canceled)
		require.Equal(t, ledger.PurgeResult{Deleted: 2, Batches: 1}, o.res)
	case <-time.After(30 * time.Second):
		t.Fatal("the purge did not end when its context was cancelled during a pause")
	}
	_, err := b.out.Purge(ctx, &ledger.PurgeOpts{BatchSize: -1})
	require.Error(t, err, "a negative batch size is refused")
}

// The values the documentation states and the dashboards and alerts filter on: changing
// one breaks users, so it goes in the CHANGELOG, and this test says so first.
func TestDocumentedValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want any
	}{
		{outbox.SchemaDefault, "oncekit"},
		{outbox.MigrationLine, "outbox"},
		{outbox.InstrumentationName, "github.com/oncekit/oncekit/outbox"},
		{outbox.AttrTopic, "oncekit.topic"},
		{outbox.AttrEventID, "oncekit.event_id"},
		{outbox.BatchSizeDefault, 500},
		{outbox.PollIntervalDefault, time.Second},
		{outbox.BackoffMinDefault, time.Second},
		{outbox.BackoffMaxDefault, 5 * time.Minute},
		{outbox.PublishTimeoutDefault, 10 * time.Second},
		// Over twice the default PublishTimeout, so a publication never outlives its lease.
		{outbox.LeaseDefault, 30 * time.Second},
		{outbox.AcquireTimeoutDefault, 10 * time.Second},
		{outbox.StopGraceDefault, 5 * time.Second},
		{outbox.DeadLimitDefault, 100},
		{outbox.MaxRetryDead, 10000},
	} {
		require.Equal(t, c.want, c.got)
	}
	require.Greater(t, outbox.LeaseDefault, 2*outbox.PublishTimeoutDefault)
}

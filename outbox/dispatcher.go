package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Publisher publishes one event. It must be safe for concurrent use by several
// dispatchers. A nil error means the event reached its destination.
type Publisher interface {
	Publish(ctx context.Context, e Event) error
}

// PublisherFunc adapts a function to [Publisher].
type PublisherFunc func(ctx context.Context, e Event) error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, e Event) error { return f(ctx, e) }

// ErrPermanent marks a publication error no retry can fix: the event goes to the dead
// state at once. Wrap it: fmt.Errorf("...: %w", outbox.ErrPermanent).
var ErrPermanent = errors.New("oncekit/outbox: permanent publication failure")

// Defaults of [DispatcherConfig].
const (
	BatchSizeDefault    = 500
	PollIntervalDefault = time.Second
	MaxAttemptsDefault  = 10
	BackoffMinDefault   = time.Second
	BackoffMaxDefault   = 5 * time.Minute
	// PublishTimeoutDefault bounds one publication.
	PublishTimeoutDefault = 10 * time.Second
	// LeaseDefault is how long a claimed batch is the dispatcher's before another may
	// take the events it has not finished; the dispatcher renews it while it works. It
	// is at least twice PublishTimeout.
	LeaseDefault = 30 * time.Second
	// AcquireTimeoutDefault bounds the wait for a pool connection.
	AcquireTimeoutDefault = 10 * time.Second
	// StopGraceDefault is how long a stopping dispatcher may take to record the
	// outcomes of the publications it made.
	StopGraceDefault = 5 * time.Second
)

// DispatcherConfig configures a [Dispatcher]. A nil *DispatcherConfig means all
// defaults; a zero field means its default.
type DispatcherConfig struct {
	// BatchSize is the most events claimed at once. Defaults to [BatchSizeDefault].
	BatchSize int
	// PollInterval is how often the dispatcher looks for events when no notification
	// arrives and the last look found nothing. It is the fallback for missed
	// notifications, not a rate: while there is ready work the dispatcher keeps going.
	// Defaults to [PollIntervalDefault].
	PollInterval time.Duration
	// MaxAttempts is how many failed publications move an event to the dead state.
	// Defaults to [MaxAttemptsDefault].
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential delay between attempts, counted
	// from the failure. Default to [BackoffMinDefault] and [BackoffMaxDefault].
	BackoffMin, BackoffMax time.Duration
	// PublishTimeout bounds one publication: the publisher's context has this deadline,
	// and a publication that outlives it counts as a failed attempt (with backoff), even
	// if the publisher ignores its context. Defaults to [PublishTimeoutDefault].
	PublishTimeout time.Duration
	// Lease is how long a claimed batch belongs to this dispatcher. Claims commit at
	// once and hold no row lock while the dispatcher publishes; the lease is renewed
	// while it works, and a dispatcher that dies leaves its unfinished events to others
	// when the lease runs out. Defaults to [LeaseDefault].
	Lease time.Duration
	// AcquireTimeout bounds the wait for a connection from the outbox's pool; running
	// out is reported to ErrorFunc, and Run tries again. Defaults to
	// [AcquireTimeoutDefault].
	AcquireTimeout time.Duration
	// StopGrace is how long a dispatcher whose context was cancelled may take to record
	// what it published before it stops. Defaults to [StopGraceDefault].
	StopGrace time.Duration
	// Ordered publishes the events of an ordering key in their outbox order: an event
	// is published only when every earlier event of its key is published or dead. A
	// failing event holds back the later events of its key until it is published or
	// dead. See the package documentation for exactly what this promises. Defaults to
	// false.
	Ordered bool
	// ErrorFunc, when set, is told about errors the dispatcher recovers from (a lost
	// connection, a failed publication, no connection to be had). Calls are serialised,
	// never concurrent. Defaults to nil.
	ErrorFunc func(error)
}

// Dispatcher publishes pending events.
type Dispatcher struct {
	o   *Outbox
	pub Publisher
	cfg DispatcherConfig
	q   dispatchQueries

	errMu sync.Mutex // serialises ErrorFunc
}

// dispatchQueries is the dispatcher's SQL with the schema filled in.
type dispatchQueries struct {
	claim, published, retry, dead, release string
}

// orderedClaimLock serialises the claims of ordered dispatchers on one outbox, so that
// two of them never take different events of one key at once.
const orderedClaimLock = "SELECT pg_advisory_xact_lock(hashtextextended('oncekit.outbox.claim.' || $1::text, 0))"

// NewDispatcher returns a dispatcher for o's events.
func NewDispatcher(o *Outbox, pub Publisher, cfg *DispatcherConfig) (*Dispatcher, error) {
	if o == nil || pub == nil {
		return nil, errors.New("oncekit/outbox: NewDispatcher needs an outbox and a publisher")
	}
	c := DispatcherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.BatchSize < 0 || c.PollInterval < 0 || c.MaxAttempts < 0 || c.BackoffMin < 0 || c.BackoffMax < 0 ||
		c.PublishTimeout < 0 || c.Lease < 0 || c.AcquireTimeout < 0 || c.StopGrace < 0 {
		return nil, errors.New("oncekit/outbox: DispatcherConfig values must not be negative; zero means the default")
	}
	setDefault(&c.BatchSize, BatchSizeDefault)
	setDefault(&c.PollInterval, PollIntervalDefault)
	setDefault(&c.MaxAttempts, MaxAttemptsDefault)
	setDefault(&c.BackoffMin, BackoffMinDefault)
	setDefault(&c.BackoffMax, BackoffMaxDefault)
	setDefault(&c.PublishTimeout, PublishTimeoutDefault)
	setDefault(&c.Lease, LeaseDefault)
	setDefault(&c.AcquireTimeout, AcquireTimeoutDefault)
	setDefault(&c.StopGrace, StopGraceDefault)
	if c.Lease < 2*c.PublishTimeout {
		c.Lease = 2 * c.PublishTimeout
	}
	return &Dispatcher{o: o, pub: pub, cfg: c, q: newDispatchQueries(o.t, c.Ordered)}, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

func newDispatchQueries(t string, ordered bool) dispatchQueries {
	// $1 batch size, $2 lease. The ready events, in order of enqueueing.
	claim := `UPDATE ` + t + ` SET locked_until = now() + $2::interval WHERE id IN (
			SELECT id FROM ` + t + ` e
			WHERE state = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
			ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING seq, id, topic, coalesce(ordering_key, ''), payload, attempts, created_at`
	if ordered {
		// $1 batch size, $2 lease. The head of each key, and the events behind it: no
		// earlier pending event of the key may be waiting for a retry or leased to
		// another dispatcher.
		claim = `UPDATE ` + t + ` SET locked_until = now() + $2::interval WHERE id IN (
			SELECT id FROM ` + t + ` e
			WHERE state = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
			  AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM ` + t + ` p
				WHERE p.ordering_key = e.ordering_key AND p.state = 'pending' AND p.seq < e.seq
				  AND (p.available_at > now() OR p.locked_until > now())))
			ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING seq, id, topic, coalesce(ordering_key, ''), payload, attempts, created_at`
	}
	return dispatchQueries{
		claim: claim,
		// $1 ids.
		published: `UPDATE ` + t + ` SET state = 'published', published_at = now(), attempts = attempts + 1, locked_until = NULL
			WHERE id = ANY($1)`,
		// $1 id, $2 attempts, $3 error, $4 backoff: counted from the failure, not from the
		// statement's start.
		retry: `UPDATE ` + t + ` SET attempts = $2, last_error = $3, available_at = clock_timestamp() + $4::interval, locked_until = NULL
			WHERE id = $1`,
		dead:    `UPDATE ` + t + ` SET state = 'dead', attempts = $2, last_error = $3, locked_until = NULL WHERE id = $1`,
		release: `UPDATE ` + t + ` SET locked_until = NULL WHERE id = ANY($1) AND state = 'pending'`,
	}
}

// Run dispatches until ctx is done, waking on notifications and polling as the
// fallback. It survives lost connections and PostgreSQL restarts, retrying with
// backoff, and returns only ctx's error. It listens on a connection of its own, opened
// with the pool's configuration, so the dispatching pool keeps all its connections for
// dispatching.
//
// Stopping costs little: the publications already made are recorded within
// StopGrace, and the batch's other events are released at once to other dispatchers.
// A publication in flight at the stop is not known to have arrived; it is attempted
// again later, as at-least-once delivery allows.
// After a failed batch, Run waits retryFirst, doubling up to dispatchRetryMax; a lost
// LISTEN connection is redialled after retryFirst, doubling up to listenRetryMax.
const (
	retryFirst       = 100 * time.Millisecond
	dispatchRetryMax = 5 * time.Second
	listenRetryMax   = 2 * time.Second
)

func (d *Dispatcher) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		d.listen(ctx, wake)
	}()
	defer func() { <-listening }()
	backoff := retryFirst
	for {
		n, err := d.DispatchOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			d.report(err)
			if !sleep(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(backoff*2, dispatchRetryMax)
			continue
		}
		backoff = retryFirst
		if n > 0 {
			continue // there was ready work, so there may be more: an ordered key's next event
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// listen forwards notifications to wake, on a connection of its own, reconnecting when
// the connection is lost.
func (d *Dispatcher) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, d.o.pool.Config().ConnConfig.Copy())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.o.channel}.Sanitize()); err != nil {
				return err
			}
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		d.report(fmt.Errorf("oncekit/outbox: listen: %w", err))
		sleep(ctx, time.Second) // polling covers the gap
	}
}

// claimed is an event of a claimed batch.
type claimed struct {
	Event
	seq int64
}

// Drain dispatches batches until none is ready, and returns how many events it claimed:
// for tests, scripts and a last pass before shutdown. An event whose publication failed
// waits out its backoff, so it does not keep Drain going.
func (d *Dispatcher) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := d.DispatchOnce(ctx)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// DispatchOnce claims one batch with a lease and commits the claim, publishes the
// events one by one (each within PublishTimeout), and records the outcomes. No row
// lock is held while publishing. It returns how many events it claimed.
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	claimedAt := time.Now()
	events, err := d.claimBatch(ctx)
	if err != nil || len(events) == 0 {
		return 0, err
	}
	var (
		outcome = &pgx.Batch{}
		done    []uuid.UUID
		skipped []claimed           // ordered events behind a failed one of their key
		held    = map[string]bool{} // ordering keys with a failed event in this batch
		renewAt = time.Now().Add(d.cfg.Lease / 2)
		next    int // the first event not handled yet
	)
	record := func(ctx context.Context, rest []claimed) error {
		if len(done) > 0 {
			outcome.Queue(d.q.published, done)
		}
		if len(rest) > 0 {
			ids := make([]uuid.UUID, len(rest))
			for i, e := range rest {
				ids[i] = e.ID
			}
			outcome.Queue(d.q.release, ids)
		}
		if err := d.sendOutcomes(ctx, outcome); err != nil {
			outcome.QueuedQueries = slices.DeleteFunc(outcome.QueuedQueries, func(q *pgx.QueuedQuery) bool {
				return q.SQL == d.q.published || q.SQL == d.q.release
			})
			return err
		}
		outcome, done = &pgx.Batch{}, nil
		return nil
	}
	for ; next < len(events) && ctx.Err() == nil; next++ {
		e := events[next]
		if d.cfg.Ordered && e.OrderingKey != "" && held[e.OrderingKey] {
			skipped = append(skipped, e) // a failed event of its key goes first
			continue
		}
		if time.Now().After(renewAt) {
			// A long batch: record what is done and renew the lease of the rest.
			if err := record(ctx, nil); err != nil {
				return len(events), err
			}
			if err := d.renew(ctx, events[next:]); err != nil {
				return len(events), err
			}
			renewAt = time.Now().Add(d.cfg.Lease / 2)
		}
		perr := d.o.tel.publication(ctx, e.Event, func(ctx context.Context) error { return d.publish(ctx, e.Event) })
		if perr == nil {
			done = append(done, e.ID)
			continue
		}
		if ctx.Err() != nil {
			break // stopping: the publication in flight is not known to have arrived
		}
		held[e.OrderingKey] = true
		d.report(fmt.Errorf("oncekit/outbox: publish %s (%s): %w", e.ID, e.Topic, perr))
		attempts := e.Attempts + 1
		if attempts >= d.cfg.MaxAttempts || errors.Is(perr, ErrPermanent) {
			d.o.tel.died(ctx, e.Event, attempts, perr)
			outcome.Queue(d.q.dead, e.ID, attempts, perr.Error())
		} else {
			outcome.Queue(d.q.retry, e.ID, attempts, perr.Error(), pgsql.Interval(d.backoff(attempts)))
		}
	}
	rest := append(skipped, events[next:]...)
	recordCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		recordCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StopGrace)
		defer cancel()
	}
	// The outcomes are retried while the lease lasts: a dispatcher that lost its
	// connection (a PostgreSQL restart) still knows what it published.
	for backoff := retryFirst; ; backoff = min(backoff*2, listenRetryMax) {
		err := record(recordCtx, rest)
		if err == nil {
			break
		}
		if recordCtx.Err() != nil || time.Now().After(claimedAt.Add(d.cfg.Lease/2)) {
			return len(events), err
		}
		d.report(fmt.Errorf("oncekit/outbox: record the outcomes of %d events (retrying): %w", len(events), err))
		if !sleep(recordCtx, backoff) {
			return len(events), err
		}
	}
	if ctx.Err() != nil {
		return len(events), ctx.Err()
	}
	return len(events), nil
}

// claimBatch claims up to BatchSize ready events under a lease, committed at once.
func (d *Dispatcher) claimBatch(ctx context.Context) ([]claimed, error) {
	conn, err := d.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var rows pgx.Rows
	lease := pgsql.Interval(d.cfg.Lease)
	if d.cfg.Ordered {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, orderedClaimLock, d.o.t); err != nil {
			return nil, err
		}
		if rows, err = tx.Query(ctx, d.q.claim, d.cfg.BatchSize, lease); err != nil {
			return nil, err
		}
		events, err := collectClaimed(rows)
		if err != nil {
			return nil, err
		}
		return events, tx.Commit(ctx)
	}
	if rows, err = conn.Query(ctx, d.q.claim, d.cfg.BatchSize, lease); err != nil {
		return nil, err
	}
	return collectClaimed(rows)
}

func collectClaimed(rows pgx.Rows) ([]claimed, error) {
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var e claimed
		err := r.Scan(&e.seq, &e.ID, &e.Topic, &e.OrderingKey, &e.Payload, &e.Attempts, &e.CreatedAt)
		return e, err
	})
	slices.SortFunc(events, func(a, b claimed) int { return cmp.Compare(a.seq, b.seq) })
	return events, err
}

// acquire takes a pool connection within AcquireTimeout.
func (d *Dispatcher) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, d.cfg.AcquireTimeout)
	defer cancel()
	conn, err := d.o.pool.Acquire(actx)
	if err != nil && ctx.Err() == nil {
		st := d.o.pool.Stat()
		return nil, fmt.Errorf("oncekit/outbox: no pool connection within %s (%d of %d in use): %w",
			d.cfg.AcquireTimeout, st.AcquiredConns(), st.MaxConns(), err)
	}
	return conn, err
}

// renew extends the lease of the events still to publish.
func (d *Dispatcher) renew(ctx context.Context, rest []claimed) error {
	ids := make([]uuid.UUID, len(rest))
	for i, e := range rest {
		ids[i] = e.ID
	}
	conn, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, `UPDATE `+d.o.t+` SET locked_until = now() + $2::interval WHERE id = ANY($1) AND state = 'pending'`,
		ids, pgsql.Interval(d.cfg.Lease))
	return err
}

func (d *Dispatcher) sendOutcomes(ctx context.Context, b *pgx.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	conn, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return conn.SendBatch(ctx, b).Close()
}

// publish runs one publication within PublishTimeout, and gives up on a publisher that
// ignores its context once the deadline has passed.
func (d *Dispatcher) publish(ctx context.Context, e Event) error {
	pctx, cancel := context.WithTimeout(ctx, d.cfg.PublishTimeout)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- d.pub.Publish(pctx, e) }()
	select {
	case err := <-res:
		if err != nil && pctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("oncekit/outbox: publication timed out after %s: %w", d.cfg.PublishTimeout, err)
		}
		return err
	case <-pctx.Done():
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("oncekit/outbox: publication timed out after %s", d.cfg.PublishTimeout)
	}
}

func (d *Dispatcher) backoff(attempt int) time.Duration {
	f := float64(d.cfg.BackoffMin) * math.Pow(2, float64(attempt-1))
	if f > float64(d.cfg.BackoffMax) {
		return d.cfg.BackoffMax
	}
	return time.Duration(f)
}

func (d *Dispatcher) report(err error) {
	if d.cfg.ErrorFunc != nil {
		d.errMu.Lock()
		defer d.errMu.Unlock()
		d.cfg.ErrorFunc(err)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

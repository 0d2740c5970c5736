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
	"github.com/oncekit/oncekit/ledger"
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
	// take the events it has not finished; the dispatcher renews it while it works.
	// With a PublishTimeout over half of it, the default lease is twice PublishTimeout.
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
	// MaxAttempts is how many failed publications move an event to the dead state. A
	// publication fails when its publisher returns an error or outlives PublishTimeout;
	// one whose outcome is unknown is not a failure and is not counted: one cut short by
	// the dispatcher's stop ([Dispatcher.Run]), or whose dispatcher died or lost its lease
	// before recording it. Defaults to [MaxAttemptsDefault].
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential delay between attempts, counted
	// from the failure: a failure is recorded at once, and its event is free for any
	// dispatcher when the delay ends. Default to [BackoffMinDefault] and
	// [BackoffMaxDefault].
	BackoffMin, BackoffMax time.Duration
	// PublishTimeout bounds one publication: the publisher's context has this deadline,
	// and a publication that outlives it counts as a failed attempt (with backoff), even
	// if the publisher ignores its context, unless the publisher still reports success
	// within a short grace (an eighth of Lease, within the lease's margin): then the
	// event counts as published. Defaults to [PublishTimeoutDefault].
	PublishTimeout time.Duration
	// Lease is how long a claimed batch belongs to this dispatcher. Claims commit at
	// once and hold no row lock while the dispatcher publishes; a dispatcher that dies
	// leaves its unfinished events to others when the lease runs out.
	//
	// The rule: a publication starts only while the lease has at least PublishTimeout
	// and a quarter of the lease left (by the dispatcher's clock, counted from when it
	// sent the claim or the last renewal, which is before the database set the lease);
	// otherwise the dispatcher renews it first. So a publication, and a publisher's late
	// return (up to an eighth of the lease), end within the lease, and its outcome has
	// the rest of the quarter to be recorded. The lease must be at least twice
	// PublishTimeout: NewDispatcher refuses a shorter one with [ErrInvalidConfig].
	// Defaults to [LeaseDefault], or twice PublishTimeout when that is longer.
	Lease time.Duration
	// AcquireTimeout bounds the wait for a connection from the outbox's pool; running
	// out is reported to ErrorFunc, and Run tries again. A wait longer than the lease
	// can cost the dispatcher its batch ([ErrLeaseLost]). Defaults to
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
	// connection, a failed publication, no connection to be had, a lost lease). Calls
	// are serialised, never concurrent. Defaults to nil.
	ErrorFunc func(error)
}

// Dispatcher errors.
var (
	// ErrInvalidConfig: a DispatcherConfig that NewDispatcher refuses.
	ErrInvalidConfig = errors.New("oncekit/outbox: invalid DispatcherConfig")
	// ErrLeaseLost: another dispatcher took over events of this dispatcher's batch after
	// its lease ran out. [*LeaseLostError] matches it.
	ErrLeaseLost = errors.New("oncekit/outbox: lease lost")
)

// LeaseLostError reports that a dispatcher found events of its batch owned by another
// dispatcher: its lease ran out (its pool had no connection for it, or the database was
// out of reach, for longer than the lease) and another claimed them. The dispatcher
// published none of them after it lost them, recorded nothing over the other's claim,
// and dropped the rest of its batch. Run reports it to ErrorFunc and goes on.
type LeaseLostError struct {
	// Events counts the events found owned by another dispatcher.
	Events int
	// AfterLostAnswer is true when the batch's outcomes had been sent before and
	// their answer was lost: the events not found owned may have been recorded by
	// that earlier send, not taken by another dispatcher.
	AfterLostAnswer bool
}

func (e *LeaseLostError) Error() string {
	if e.AfterLostAnswer {
		return fmt.Sprintf("oncekit/outbox: %d events of this dispatcher's batch were no longer owned when their outcomes were sent again after an answer was lost: that lost send recorded them, or another dispatcher claimed them after the lease ran out; the rest of the batch was dropped",
			e.Events)
	}
	return fmt.Sprintf("oncekit/outbox: %d events of this dispatcher's batch were claimed by another dispatcher after its lease ran out; the rest of the batch was dropped: if this repeats, give the pool more connections or raise DispatcherConfig.Lease",
		e.Events)
}

// Is matches [ErrLeaseLost].
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Dispatcher publishes pending events.
type Dispatcher struct {
	o   *Outbox
	pub Publisher
	cfg DispatcherConfig
	q   dispatchQueries

	errMu sync.Mutex // serialises ErrorFunc
}

// dispatchQueries is the dispatcher's SQL with the schema filled in. Every statement
// after the claim names the batch's owner token ($2), so that a dispatcher whose lease
// ran out can change nothing another dispatcher has claimed since.
type dispatchQueries struct {
	claim, published, retry, dead, release, renew string
}

// orderedClaimLock serialises the claims of ordered dispatchers on one outbox, so that
// two of them never take different events of one key at once.
const orderedClaimLock = "SELECT pg_advisory_xact_lock(hashtextextended('oncekit.outbox.claim.' || $1::text, 0))"

// NewDispatcher returns a dispatcher for o's events. A DispatcherConfig it refuses is
// reported as [ErrInvalidConfig].
func NewDispatcher(o *Outbox, pub Publisher, cfg *DispatcherConfig) (*Dispatcher, error) {
	if o == nil || pub == nil {
		return nil, errors.New("oncekit/outbox: NewDispatcher needs an outbox and a publisher")
	}
	if o.shards != nil {
		return nil, fmt.Errorf("%w: the outbox is on %d shards, and a dispatcher runs on one: make one per shard, each on o.Shard(name)", ErrInvalidConfig, len(o.shards))
	}
	c := DispatcherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.BatchSize < 0 || c.PollInterval < 0 || c.MaxAttempts < 0 || c.BackoffMin < 0 || c.BackoffMax < 0 ||
		c.PublishTimeout < 0 || c.Lease < 0 || c.AcquireTimeout < 0 || c.StopGrace < 0 {
		return nil, fmt.Errorf("%w: values must not be negative; zero means the default", ErrInvalidConfig)
	}
	setDefault(&c.BatchSize, BatchSizeDefault)
	setDefault(&c.PollInterval, PollIntervalDefault)
	setDefault(&c.MaxAttempts, MaxAttemptsDefault)
	setDefault(&c.BackoffMin, BackoffMinDefault)
	setDefault(&c.BackoffMax, BackoffMaxDefault)
	setDefault(&c.PublishTimeout, PublishTimeoutDefault)
	setDefault(&c.Lease, max(LeaseDefault, 2*c.PublishTimeout))
	setDefault(&c.AcquireTimeout, AcquireTimeoutDefault)
	setDefault(&c.StopGrace, StopGraceDefault)
	if c.Lease < 2*c.PublishTimeout {
		return nil, fmt.Errorf("%w: Lease %s is shorter than twice PublishTimeout (%s): a publication needs PublishTimeout and a quarter of the lease left when it starts; raise Lease to at least %s or lower PublishTimeout",
			ErrInvalidConfig, c.Lease, c.PublishTimeout, 2*c.PublishTimeout)
	}
	return &Dispatcher{o: o, pub: pub, cfg: c, q: newDispatchQueries(o.t, c.Ordered)}, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// margin is what a publication must leave of the lease, beyond PublishTimeout; grace
// is how long after the deadline the dispatcher waits for a publisher to return.
func (d *Dispatcher) margin() time.Duration { return d.cfg.Lease / 4 }
func (d *Dispatcher) grace() time.Duration  { return d.cfg.Lease / 8 }

func newDispatchQueries(t string, ordered bool) dispatchQueries {
	const returning = `RETURNING seq, id, topic, coalesce(ordering_key, ''), payload, attempts, created_at, trace_context`
	// $1 batch size, $2 lease, $3 owner token. The ready events, in order of enqueueing.
	claim := `UPDATE ` + t + ` SET locked_until = now() + $2::interval, locked_by = $3 WHERE id IN (
			SELECT id FROM ` + t + ` e
			WHERE state = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
			ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
		` + returning
	if ordered {
		// $1 batch size, $2 lease, $3 owner token. The head of each key, and the events
		// behind it: no earlier pending event of the key may be waiting for a retry or
		// leased. And none may be missing from the claim: SKIP LOCKED passes over a row
		// another transaction has locked (a dispatcher recording its outcome), and the
		// events behind it must wait with it.
		claim = `WITH ready AS (
			SELECT id, seq, ordering_key FROM ` + t + ` e
			WHERE state = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now())
			  AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM ` + t + ` p
				WHERE p.ordering_key = e.ordering_key AND p.state = 'pending' AND p.seq < e.seq
				  AND (p.available_at > now() OR p.locked_until > now())))
			ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED
		), gap AS (
			SELECT k.ordering_key, (SELECT p.seq FROM ` + t + ` p
				WHERE p.ordering_key = k.ordering_key AND p.state = 'pending' AND p.id NOT IN (SELECT id FROM ready)
				ORDER BY p.seq LIMIT 1) AS seq
			FROM (SELECT DISTINCT ordering_key FROM ready WHERE ordering_key IS NOT NULL) k
		)
		UPDATE ` + t + ` SET locked_until = now() + $2::interval, locked_by = $3 WHERE id IN (
			SELECT ready.id FROM ready LEFT JOIN gap ON gap.ordering_key = ready.ordering_key
			WHERE gap.seq IS NULL OR ready.seq < gap.seq)
		` + returning
	}
	return dispatchQueries{
		claim: claim,
		// $1 ids, $2 owner token.
		published: `UPDATE ` + t + ` SET state = 'published', published_at = now(), attempts = attempts + 1, locked_until = NULL, locked_by = NULL
			WHERE id = ANY($1) AND locked_by = $2`,
		// $1 id, $2 owner token, $3 attempts, $4 error, $5 what is left of the backoff
		// counted from the failure, measured when the statement was sent: from the start
		// of this statement, not of its transaction (statement_timestamp, not now;
		// clock_timestamp is volatile, which Citus refuses in an UPDATE).
		retry: `UPDATE ` + t + ` SET attempts = $3, last_error = $4, available_at = statement_timestamp() + $5::interval, locked_until = NULL, locked_by = NULL
			WHERE id = $1 AND locked_by = $2`,
		// $1 id, $2 owner token, $3 attempts, $4 error.
		dead: `UPDATE ` + t + ` SET state = 'dead', attempts = $3, last_error = $4, locked_until = NULL, locked_by = NULL
			WHERE id = $1 AND locked_by = $2`,
		// $1 ids, $2 owner token.
		release: `UPDATE ` + t + ` SET locked_until = NULL, locked_by = NULL WHERE id = ANY($1) AND locked_by = $2`,
		// $1 ids, $2 owner token, $3 lease.
		renew: `UPDATE ` + t + ` SET locked_until = now() + $3::interval WHERE id = ANY($1) AND locked_by = $2`,
	}
}

// After a failed batch, Run waits retryFirst, doubling up to dispatchRetryMax; a lost
// LISTEN connection is redialled after retryFirst, doubling up to listenRetryMax.
const (
	retryFirst       = 100 * time.Millisecond
	dispatchRetryMax = 5 * time.Second
	listenRetryMax   = 2 * time.Second
)

// Run dispatches until ctx is done, waking on notifications and polling as the
// fallback. It survives lost connections and PostgreSQL restarts, retrying with
// backoff, and returns only ctx's error. It listens on a connection of its own, opened
// with the pool's configuration, so the dispatching pool keeps all its connections for
// dispatching; that connection is outside the pool's MaxConns.
//
// Stopping costs little: the outcomes of the publications already made are recorded
// within StopGrace, and the batch's other events are released at once to other
// dispatchers. A publication in flight at the stop is cut short and not known to have
// arrived: it is not a failed publication, so its event keeps its [Event.Attempts] and
// is published again, as at-least-once delivery allows.
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

// listen forwards notifications to wake, on a connection of its own (outside the pool's
// MaxConns), reconnecting when the connection is lost.
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
	seq          int64
	traceContext []byte
}

// batch is a claimed batch: its owner token, its events in outbox order, and when its
// lease ends by this process's clock. leaseEnd is early, never late: it counts from when
// the claim or the last renewal was sent, and the database set the lease after that.
type batch struct {
	token    uuid.UUID
	events   []claimed
	leaseEnd time.Time
	// answerLost is set once a send of the batch's outcomes lost its answer.
	answerLost bool
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

// DispatchOnce claims one batch under a lease of its own and commits the claim,
// publishes the events one by one (each within PublishTimeout, renewing the lease as
// DispatcherConfig.Lease says), and records the outcomes: a failure at once, the
// publications at the end. No row lock is held while publishing. It returns how many
// events it claimed. When it finds events of its batch claimed by another dispatcher it
// drops the rest of the batch and returns a [*LeaseLostError].
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	b, err := d.claimBatch(ctx)
	if err != nil || len(b.events) == 0 {
		return 0, err
	}
	return len(b.events), d.dispatch(ctx, b)
}

// outcomes are what a dispatcher has to record of its batch.
type outcomes struct {
	published []uuid.UUID
	failures  []failure
	release   []uuid.UUID
}

// failure is a failed publication to record.
type failure struct {
	id       uuid.UUID
	attempts int
	err      string
	dead     bool
	backoff  time.Duration
	at       time.Time
}

func (d *Dispatcher) dispatch(ctx context.Context, b *batch) error {
	var (
		out     outcomes
		held    = map[string]bool{} // ordered keys with a failed event in this batch
		next    int                 // the first event not handled yet
		stopErr error               // why the batch stopped early
	)
	// unfinished lists the events from next on that this batch may still publish.
	unfinished := func() []uuid.UUID {
		var ids []uuid.UUID
		for _, e := range b.events[next:] {
			if !held[e.OrderingKey] {
				ids = append(ids, e.ID)
			}
		}
		return ids
	}
	for ; next < len(b.events) && ctx.Err() == nil; next++ {
		e := b.events[next]
		if d.cfg.Ordered && e.OrderingKey != "" && held[e.OrderingKey] {
			continue // released when its key's failed event was recorded
		}
		if time.Until(b.leaseEnd) < d.cfg.PublishTimeout+d.margin() {
			// Not enough lease left for a publication: record what is done and renew the
			// lease of the rest. A renewal that finds another owner stops the batch.
			if err := d.send(ctx, b, &out, unfinished()); err != nil {
				stopErr = err
				break
			}
			if time.Until(b.leaseEnd) < d.cfg.PublishTimeout+d.margin() {
				stopErr = fmt.Errorf("oncekit/outbox: renewing the lease took %s, more than Lease leaves over PublishTimeout: the batch is dropped",
					d.cfg.Lease-time.Until(b.leaseEnd))
				break
			}
		}
		perr := d.o.tel.publication(ctx, e, func(ctx context.Context) error { return d.publish(ctx, e.Event) })
		if perr == nil {
			out.published = append(out.published, e.ID)
			continue
		}
		if ctx.Err() != nil {
			break // stopping: the publication in flight is not known to have arrived
		}
		d.report(fmt.Errorf("oncekit/outbox: publish %s (%s): %w", e.ID, e.Topic, perr))
		f := failure{id: e.ID, attempts: e.Attempts + 1, err: perr.Error(), at: time.Now()}
		if f.dead = f.attempts >= d.cfg.MaxAttempts || errors.Is(perr, ErrPermanent); f.dead {
			d.o.tel.died(ctx, e.Event, f.attempts, perr)
		} else {
			f.backoff = d.backoff(f.attempts)
		}
		out.failures = append(out.failures, f)
		if d.cfg.Ordered && e.OrderingKey != "" {
			// The later events of its key wait for it: they go back to the outbox with
			// the failure, free for whichever dispatcher finds them ready.
			held[e.OrderingKey] = true
			for _, later := range b.events[next+1:] {
				if later.OrderingKey == e.OrderingKey {
					out.release = append(out.release, later.ID)
				}
			}
		}
		// Recorded at once: the backoff counts from the failure, and when it ends the
		// event is free for any dispatcher, not only this one after its batch.
		if err := d.send(ctx, b, &out, nil); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				stopErr = err
				break
			}
			// Kept, and sent with the next renewal or at the end.
			d.report(fmt.Errorf("oncekit/outbox: record a failed publication (retrying): %w", err))
		}
	}
	out.release = append(out.release, unfinished()...)
	recordCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		recordCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), d.cfg.StopGrace)
		defer cancel()
	}
	// The outcomes are retried while the lease lasts: a dispatcher that lost its
	// connection (a PostgreSQL restart) still knows what it published.
	for backoff := retryFirst; ; backoff = min(backoff*2, listenRetryMax) {
		err := d.send(recordCtx, b, &out, nil)
		if err == nil || errors.Is(err, ErrLeaseLost) {
			stopErr = cmp.Or(stopErr, err)
			break
		}
		if recordCtx.Err() != nil || time.Now().After(b.leaseEnd) {
			return err
		}
		d.report(fmt.Errorf("oncekit/outbox: record the outcomes of %d events (retrying): %w", len(b.events), err))
		if !sleep(recordCtx, backoff) {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return stopErr
}

// send records out and renews the lease of renew, in one round trip, all under the
// batch's owner token; on success out is emptied. A statement that touches fewer rows
// than it names found them owned by another dispatcher: send reports a
// [*LeaseLostError] then (everything else it sent took effect).
func (d *Dispatcher) send(ctx context.Context, b *batch, out *outcomes, renew []uuid.UUID) error {
	q := &pgx.Batch{}
	var want []int // rows each statement must touch
	if len(out.published) > 0 {
		q.Queue(d.q.published, out.published, b.token)
		want = append(want, len(out.published))
	}
	for _, f := range out.failures {
		if f.dead {
			q.Queue(d.q.dead, f.id, b.token, f.attempts, f.err)
		} else {
			q.Queue(d.q.retry, f.id, b.token, f.attempts, f.err, pgsql.Interval(max(f.backoff-time.Since(f.at), 0)))
		}
		want = append(want, 1)
	}
	if len(out.release) > 0 {
		q.Queue(d.q.release, out.release, b.token)
		want = append(want, len(out.release))
	}
	if len(renew) > 0 {
		q.Queue(d.q.renew, renew, b.token, pgsql.Interval(d.cfg.Lease))
		want = append(want, len(renew))
	}
	if q.Len() == 0 {
		return nil
	}
	conn, err := d.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sent := time.Now()
	br := conn.SendBatch(ctx, q)
	lost := 0
	for _, n := range want {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return b.sendErr(err)
		}
		lost += n - int(tag.RowsAffected())
	}
	if err := br.Close(); err != nil {
		return b.sendErr(err)
	}
	*out = outcomes{}
	if len(renew) > 0 {
		b.leaseEnd = sent.Add(d.cfg.Lease)
	}
	if lost > 0 {
		return &LeaseLostError{Events: lost, AfterLostAnswer: b.answerLost}
	}
	return nil
}

// sendErr is the error of a send of b's outcomes. The batch commits as one implicit
// transaction: an answer lost after it was sent leaves the outcomes recorded or not,
// unknown, and a later send of them says so if it finds the events no longer owned.
func (b *batch) sendErr(err error) error {
	if !pgsql.CommitUnknown(err) {
		return err
	}
	b.answerLost = true
	return fmt.Errorf("oncekit/outbox: the outcomes were sent and the answer was lost, so whether they were recorded is unknown (%w): %w", ledger.ErrOutcomeUnknown, err)
}

// claimBatch claims up to BatchSize ready events under a lease with a new owner token,
// committed at once.
func (d *Dispatcher) claimBatch(ctx context.Context) (*batch, error) {
	conn, err := d.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	b := &batch{token: uuid.New(), leaseEnd: time.Now().Add(d.cfg.Lease)}
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
		rows, err := tx.Query(ctx, d.q.claim, d.cfg.BatchSize, lease, b.token)
		if err != nil {
			return nil, err
		}
		if b.events, err = collectClaimed(rows); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, claimErr(err)
		}
		return b, nil
	}
	// The claim commits by itself: an answer lost after it was sent leaves its events
	// locked, or not, until the lease runs out.
	rows, err := conn.Query(ctx, d.q.claim, d.cfg.BatchSize, lease, b.token)
	if err != nil {
		return nil, claimErr(err)
	}
	if b.events, err = collectClaimed(rows); err != nil {
		return nil, claimErr(err)
	}
	return b, nil
}

// claimErr is the error of a batch's claim whose commit was sent: a lost answer is an
// unknown outcome (the events it locked wait out the lease), never a claim that did not
// happen.
func claimErr(err error) error {
	if !pgsql.CommitUnknown(err) {
		return err
	}
	return fmt.Errorf("oncekit/outbox: the claim of a batch was sent and its answer was lost, so whether it locked events (until its lease runs out) is unknown (%w): %w", ledger.ErrOutcomeUnknown, err)
}

func collectClaimed(rows pgx.Rows) ([]claimed, error) {
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var e claimed
		err := r.Scan(&e.seq, &e.ID, &e.Topic, &e.OrderingKey, &e.Payload, &e.Attempts, &e.CreatedAt, &e.traceContext)
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
		return nil, fmt.Errorf("oncekit/outbox: no pool connection within %s (%d of %d in use; the dispatchers' LISTEN connections are not counted there): %w",
			d.cfg.AcquireTimeout, st.AcquiredConns(), st.MaxConns(), err)
	}
	return conn, err
}

// publish runs one publication within PublishTimeout. At the deadline, or when the
// dispatcher stops, it waits a little (grace) for the publisher to return, so that a
// publisher that honours its context has ended before its event, or the next event of
// its key, can go to another dispatcher; one that ignores its context is abandoned then.
func (d *Dispatcher) publish(ctx context.Context, e Event) error {
	pctx, cancel := context.WithTimeout(ctx, d.cfg.PublishTimeout)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- d.pub.Publish(pctx, e) }()
	var err error
	select {
	case err = <-res:
		if err == nil || pctx.Err() == nil {
			return err
		}
	case <-pctx.Done():
		t := time.NewTimer(d.grace())
		defer t.Stop()
		select {
		case err = <-res:
			if err == nil && ctx.Err() == nil {
				// The publisher answered within the grace, while the lease still holds
				// (the grace is within its margin): the event arrived.
				return nil
			}
		case <-t.C:
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("oncekit/outbox: publication timed out after %s: %w", d.cfg.PublishTimeout, err)
	}
	return fmt.Errorf("oncekit/outbox: publication timed out after %s", d.cfg.PublishTimeout)
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

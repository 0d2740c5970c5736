package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
)

// DispatcherConfig configures a [Dispatcher]. A nil *DispatcherConfig means all
// defaults.
type DispatcherConfig struct {
	// BatchSize is the most events claimed at once. Defaults to [BatchSizeDefault].
	BatchSize int
	// PollInterval is how often the dispatcher looks for events when no notification
	// arrives. Defaults to [PollIntervalDefault].
	PollInterval time.Duration
	// MaxAttempts is how many failed publications move an event to the dead state.
	// Defaults to [MaxAttemptsDefault].
	MaxAttempts int
	// BackoffMin and BackoffMax bound the exponential delay between attempts.
	// Default to [BackoffMinDefault] and [BackoffMaxDefault].
	BackoffMin, BackoffMax time.Duration
	// Ordered publishes the events of an ordering key one at a time, in enqueue order; a
	// failing event holds back the later events of its key until it is published or
	// dead. Defaults to false.
	Ordered bool
	// ErrorFunc, when set, is told about errors the dispatcher recovers from (a lost
	// connection, a failed publication). Defaults to nil.
	ErrorFunc func(error)
}

// Dispatcher publishes pending events.
type Dispatcher struct {
	o     *Outbox
	pub   Publisher
	cfg   DispatcherConfig
	claim string
}

// NewDispatcher returns a dispatcher for o's events.
func NewDispatcher(o *Outbox, pub Publisher, cfg *DispatcherConfig) (*Dispatcher, error) {
	if o == nil || pub == nil {
		return nil, errors.New("oncekit/outbox: NewDispatcher needs an outbox and a publisher")
	}
	c := DispatcherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.BatchSize <= 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.PollInterval <= 0 {
		c.PollInterval = PollIntervalDefault
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = BackoffMinDefault
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = BackoffMaxDefault
	}
	claim := `SELECT id, topic, coalesce(ordering_key, ''), payload, attempts, created_at FROM ` + o.t + ` e
		WHERE state = 'pending' AND available_at <= now()`
	if c.Ordered {
		// Only the head of each ordering key: an earlier pending event, even one another
		// dispatcher holds, keeps the later ones back.
		claim += ` AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM ` + o.t + ` p
			WHERE p.ordering_key = e.ordering_key AND p.state = 'pending' AND p.seq < e.seq))`
	}
	claim += ` ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`
	return &Dispatcher{o: o, pub: pub, cfg: c, claim: claim}, nil
}

// Run dispatches until ctx is done, waking on notifications and polling as the
// fallback. It survives lost connections and PostgreSQL restarts, retrying with
// backoff, and returns only ctx's error.
func (d *Dispatcher) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	go d.listen(ctx, wake)
	backoff := 100 * time.Millisecond
	for {
		n, err := d.DispatchOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			d.report(err)
			n = 0
			if !sleep(ctx, backoff) {
				return ctx.Err()
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if n == d.cfg.BatchSize {
			continue // more are waiting
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

// listen forwards notifications to wake, reconnecting when the connection is lost.
func (d *Dispatcher) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
			conn, err := d.o.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.o.channel}.Sanitize()); err != nil {
				return err
			}
			defer func() {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *")
			}()
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
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

// DispatchOnce claims one batch, publishes it and records the outcomes, all in one
// transaction, and returns how many events it claimed.
func (d *Dispatcher) DispatchOnce(ctx context.Context) (int, error) {
	tx, err := d.o.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, d.claim, d.cfg.BatchSize)
	if err != nil {
		return 0, err
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.Topic, &e.OrderingKey, &e.Payload, &e.Attempts, &e.CreatedAt)
		return e, err
	})
	if err != nil || len(events) == 0 {
		return 0, err
	}
	var published []uuid.UUID
	b := &pgx.Batch{}
	for _, e := range events {
		perr := d.pub.Publish(ctx, e)
		if perr == nil {
			published = append(published, e.ID)
			continue
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		d.report(fmt.Errorf("oncekit/outbox: publish %s (%s): %w", e.ID, e.Topic, perr))
		attempts := e.Attempts + 1
		if attempts >= d.cfg.MaxAttempts || errors.Is(perr, ErrPermanent) {
			b.Queue(`UPDATE `+d.o.t+` SET state = 'dead', attempts = $2, last_error = $3 WHERE id = $1`, e.ID, attempts, perr.Error())
		} else {
			b.Queue(`UPDATE `+d.o.t+` SET attempts = $2, last_error = $3, available_at = now() + $4::interval WHERE id = $1`,
				e.ID, attempts, perr.Error(), fmt.Sprintf("%d microseconds", d.backoff(attempts).Microseconds()))
		}
	}
	if len(published) > 0 {
		b.Queue(`UPDATE `+d.o.t+` SET state = 'published', published_at = now(), attempts = attempts + 1 WHERE id = ANY($1)`, published)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	return len(events), tx.Commit(ctx)
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

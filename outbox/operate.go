package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/config"
)

// Operator calls: what the oncekit command runs to look into the outbox and to send dead
// events again.

// The states of an event, as [EventRecord].State names them.
const (
	StatePending   = "pending"
	StatePublished = "published"
	StateDead      = "dead"
)

// Limits and defaults of the operator calls.
const (
	// DeadLimitDefault is how many events [Outbox.ListDead] returns when
	// DeadOpts.Limit is 0.
	DeadLimitDefault = 100
	// MaxRetryDead is the most events one [Outbox.RetryDead] call sends again: they are
	// all updated in one transaction, which holds their ordering keys' locks until it
	// commits.
	MaxRetryDead = 10000
)

// ErrEventNotFound: no event has the ID.
var ErrEventNotFound = errors.New("oncekit/outbox: no event with this ID")

// ErrNotDead: an event to retry is not dead, or does not exist.
var ErrNotDead = errors.New("oncekit/outbox: the event is not dead")

// NotDeadError reports the events [Outbox.RetryDead] was asked to retry that are not
// dead (or do not exist); nothing was retried.
type NotDeadError struct {
	// IDs are the events that are not dead, at most 20 of them.
	IDs []uuid.UUID
	// Count is how many there were.
	Count int
	// Missing are those of IDs that no event has (never enqueued, or purged after
	// publication), at most 20; MissingCount is how many of Count they are.
	Missing      []uuid.UUID
	MissingCount int
}

func (e *NotDeadError) Error() string {
	ids := make([]string, len(e.IDs))
	for i, id := range e.IDs {
		ids[i] = id.String()
	}
	more := ""
	if e.Count > len(e.IDs) {
		more = fmt.Sprintf(" and %d more", e.Count-len(e.IDs))
	}
	missing := ""
	if e.MissingCount > 0 {
		missing = fmt.Sprintf("; %d of them do not exist", e.MissingCount)
	}
	return fmt.Sprintf("oncekit/outbox: %d of the events to retry are not dead (%s%s%s): nothing was retried; list the dead events and retry those",
		e.Count, strings.Join(ids, ", "), more, missing)
}

// Is matches [ErrNotDead].
func (e *NotDeadError) Is(target error) bool { return target == ErrNotDead }

// EventRecord is an event as the outbox holds it.
type EventRecord struct {
	Event
	// State is StatePending, StatePublished or StateDead.
	State string
	// AvailableAt is when a dispatcher may next try a pending event.
	AvailableAt time.Time
	// PublishedAt is when a published event was published; zero otherwise.
	PublishedAt time.Time
	// LockedUntil is when the claim of the dispatcher publishing it runs out; zero when
	// no dispatcher holds it.
	LockedUntil time.Time
	// LastError is the last publication's error.
	LastError string
	// TraceParent is the W3C traceparent of the transaction that enqueued it, or "".
	TraceParent string
}

// Get returns the event with id, whatever its state, or [ErrEventNotFound].
func (o *Outbox) Get(ctx context.Context, id uuid.UUID) (*EventRecord, error) {
	if o.shards != nil {
		var found *EventRecord
		err := o.each(func(v *Outbox) error {
			e, err := v.Get(ctx, id)
			if errors.Is(err, ErrEventNotFound) {
				return nil
			}
			found = e
			return err
		})
		if found == nil && err == nil {
			err = ErrEventNotFound
		}
		return found, err
	}
	var e EventRecord
	var key, lastError *string
	var publishedAt, lockedUntil *time.Time
	var trace []byte
	err := o.pool.QueryRow(ctx, `SELECT id, topic, ordering_key, payload, attempts, created_at, state, available_at,
		published_at, locked_until, last_error, trace_context FROM `+o.t+` WHERE id = $1`, id).Scan(&e.ID, &e.Topic, &key,
		&e.Payload, &e.Attempts, &e.CreatedAt, &e.State, &e.AvailableAt, &publishedAt, &lockedUntil, &lastError, &trace)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrEventNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("oncekit/outbox: get %s: %w", id, err)
	}
	e.OrderingKey, e.LastError = deref(key), deref(lastError)
	if publishedAt != nil {
		e.PublishedAt = *publishedAt
	}
	if lockedUntil != nil && e.State == StatePending {
		e.LockedUntil = *lockedUntil
	}
	var carrier map[string]string
	if len(trace) > 0 && json.Unmarshal(trace, &carrier) == nil {
		e.TraceParent = carrier["traceparent"]
	}
	return &e, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DeadOpts filter [Outbox.ListDead]. A nil *DeadOpts lists the oldest dead events.
type DeadOpts struct {
	// Topic keeps the events of this topic. Defaults to "": every topic.
	Topic string
	// Limit bounds the number of events; a negative one is refused. Defaults to
	// [DeadLimitDefault].
	Limit int
}

// ListDead lists dead events, oldest first, filtered by opts.
func (o *Outbox) ListDead(ctx context.Context, opts *DeadOpts) ([]DeadEvent, error) {
	c := config.Of(opts)
	if c.Limit < 0 {
		return nil, fmt.Errorf("oncekit/outbox: DeadOpts.Limit %d is negative", c.Limit)
	}
	if o.shards != nil {
		return o.oldestDead(config.Or(c.Limit, DeadLimitDefault), func(v *Outbox) ([]DeadEvent, error) { return v.ListDead(ctx, opts) })
	}
	rows, err := o.pool.Query(ctx, `SELECT id, topic, coalesce(ordering_key, ''), payload, attempts, created_at, coalesce(last_error, '')
		FROM `+o.t+` WHERE state = 'dead' AND ($1 = '' OR topic = $1) ORDER BY seq LIMIT $2`, c.Topic, config.Or(c.Limit, DeadLimitDefault))
	if err != nil {
		return nil, fmt.Errorf("oncekit/outbox: list dead events: %w", err)
	}
	dead, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadEvent, error) {
		var d DeadEvent
		err := r.Scan(&d.ID, &d.Topic, &d.OrderingKey, &d.Payload, &d.Attempts, &d.CreatedAt, &d.LastError)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/outbox: list dead events: %w", err)
	}
	return dead, nil
}

// RetryDeadOpts choose the dead events [Outbox.RetryDead] sends again: the events
// named by IDs, or every dead event of Topic, or, with All, every dead event.
type RetryDeadOpts struct {
	// IDs names the events; each must be dead, and one named twice is retried once.
	// Defaults to none.
	IDs []uuid.UUID
	// Topic chooses every dead event of the topic. Defaults to "".
	Topic string
	// All chooses every dead event. Defaults to false.
	All bool
	// Actor and Reason say who retries the events and why: each event retried keeps an
	// audit row with them, the database role and the event's attempts and last error,
	// which [Outbox.ListAudit] reads back. Defaults to "": the row keeps them empty.
	Actor, Reason string
}

// RetryDead returns dead events to the pending state with their attempts reset, as
// [Outbox.Retry] does one, all in one transaction: either every chosen event is
// retried, or, when one of the IDs is not dead or more than [MaxRetryDead] events are
// chosen, none is. The events keep their relative order and take their places at the
// end of the outbox order. It returns the IDs retried, in that order.
func (o *Outbox) RetryDead(ctx context.Context, opts *RetryDeadOpts) ([]uuid.UUID, error) {
	c := config.Of(opts)
	chosen := 0
	if len(c.IDs) > 0 {
		chosen++
	}
	if c.Topic != "" {
		chosen++
	}
	if c.All {
		chosen++
	}
	if chosen != 1 {
		return nil, errors.New("oncekit/outbox: RetryDead takes exactly one of RetryDeadOpts.IDs, Topic and All")
	}
	c.IDs = distinct(c.IDs) // an ID named twice is one event to retry
	if len(c.IDs) > MaxRetryDead {
		return nil, fmt.Errorf("oncekit/outbox: %d events to retry, more than MaxRetryDead (%d): retry them in parts", len(c.IDs), MaxRetryDead)
	}
	if o.shards != nil {
		return o.retryDeadAcross(ctx, c)
	}
	var retried []uuid.UUID
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		ids := c.IDs
		if ids == nil {
			ids = []uuid.UUID{}
		}
		rows, err := tx.Query(ctx, `SELECT id, ordering_key, topic, attempts, last_error FROM `+o.t+` WHERE state = 'dead'
			AND (cardinality($1::uuid[]) = 0 OR id = ANY ($1::uuid[])) AND ($2 = '' OR topic = $2) ORDER BY seq LIMIT $3`,
			ids, c.Topic, MaxRetryDead+1)
		if err != nil {
			return err
		}
		type target struct {
			id        uuid.UUID
			key       *string
			topic     string
			attempts  int
			lastError *string
		}
		targets, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (target, error) {
			var t target
			return t, r.Scan(&t.id, &t.key, &t.topic, &t.attempts, &t.lastError)
		})
		if err != nil {
			return err
		}
		if len(targets) > MaxRetryDead {
			return fmt.Errorf("oncekit/outbox: more than MaxRetryDead (%d) dead events match: retry them by topic or by ID, in parts", MaxRetryDead)
		}
		if len(c.IDs) > 0 && len(targets) != len(c.IDs) {
			nd := notDead(c.IDs, targets, func(t target) uuid.UUID { return t.id })
			return o.findMissing(ctx, tx, c.IDs, nd)
		}
		var orderingKeys []string
		for _, t := range targets {
			if t.key != nil && !slices.Contains(orderingKeys, *t.key) {
				orderingKeys = append(orderingKeys, *t.key)
			}
		}
		// Locks in sorted order, as Enqueue takes them, before the rows, as Retry does.
		slices.Sort(orderingKeys)
		b := &pgx.Batch{}
		for _, k := range orderingKeys {
			b.Queue(keyLock, o.schema+"."+k)
		}
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		// New places in the outbox order, taken under the keys' locks, in the events'
		// order.
		seqs, err := o.newSeqs(ctx, tx, len(targets))
		if err != nil {
			return err
		}
		b = &pgx.Batch{}
		var lost []uuid.UUID
		for i, t := range targets {
			b.Queue(o.requeueSQL(), t.id, seqs[i]).Exec(func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() != 1 {
					lost = append(lost, t.id)
				}
				return nil
			})
		}
		if len(targets) > 0 {
			// The audit rows, from the events as they were read under their locks; from
			// arrays, so that no statement reads the events' table and writes the audit
			// table at once (Citus keeps the two apart).
			audit := struct {
				ids       []uuid.UUID
				topics    []string
				attempts  []int32
				lastError []*string
			}{}
			for _, t := range targets {
				audit.ids = append(audit.ids, t.id)
				audit.topics = append(audit.topics, t.topic)
				audit.attempts = append(audit.attempts, int32(t.attempts))
				audit.lastError = append(audit.lastError, t.lastError)
			}
			b.Queue(`INSERT INTO `+o.audit+` (event_id, topic, action, actor, reason, attempts, last_error)
				SELECT e.id, e.topic, 'retry', $5, $6, e.attempts, e.last_error
				FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[]) AS e (id, topic, attempts, last_error)`,
				audit.ids, audit.topics, audit.attempts, audit.lastError, c.Actor, c.Reason)
		}
		b.Queue(`SELECT pg_notify($1, '')`, o.channel)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if len(lost) > 0 {
			// Retried by another operator meanwhile.
			return notDead(lost, nil, func(t target) uuid.UUID { return t.id })
		}
		for _, t := range targets {
			retried = append(retried, t.id)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotDead) {
			return nil, err
		}
		return nil, fmt.Errorf("oncekit/outbox: retry dead events: %w", err)
	}
	if retried == nil {
		retried = []uuid.UUID{}
	}
	return retried, nil
}

// findMissing fills in nd which of ids no event has.
func (o *Outbox) findMissing(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ids []uuid.UUID, nd *NotDeadError) error {
	rows, err := q.Query(ctx, `SELECT id FROM `+o.t+` WHERE id = ANY ($1::uuid[])`, ids)
	if err != nil {
		return err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	missing := notDead(ids, found, func(id uuid.UUID) uuid.UUID { return id })
	nd.Missing, nd.MissingCount = missing.IDs, missing.Count
	return nd
}

// distinct returns ids without repeats, in the order of their first appearance.
func distinct(ids []uuid.UUID) []uuid.UUID {
	seen := make(map[uuid.UUID]bool, len(ids))
	out := ids[:0:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// notDead reports the IDs of want that found does not hold.
func notDead[T any](want []uuid.UUID, found []T, id func(T) uuid.UUID) *NotDeadError {
	have := map[uuid.UUID]bool{}
	for _, f := range found {
		have[id(f)] = true
	}
	e := &NotDeadError{}
	for _, w := range want {
		if !have[w] {
			e.Count++
			if len(e.IDs) < 20 {
				e.IDs = append(e.IDs, w)
			}
		}
	}
	return e
}

// Purgeable counts the published events a purge would delete now: those published
// longer ago than [Config].PublishedRetention.
func (o *Outbox) Purgeable(ctx context.Context) (int64, error) {
	before := time.Now().Add(-o.retention)
	var n int64
	err := o.each(func(v *Outbox) error {
		var k int64
		err := v.pool.QueryRow(ctx, `SELECT count(*) FROM `+v.t+` WHERE state = 'published' AND published_at < $1`, before).Scan(&k)
		n += k
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("oncekit/outbox: count purgeable events: %w", err)
	}
	return n, nil
}

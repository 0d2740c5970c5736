package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

// Event is one message to publish.
type Event struct {
	// ID identifies the event to its consumers, the same on every publication.
	// Defaults to a new UUID (time-ordered).
	ID uuid.UUID
	// Topic routes the event.
	Topic string
	// OrderingKey groups events that must be published in order (with
	// DispatcherConfig.Ordered), such as an account ID. Optional.
	OrderingKey string
	// Payload is the event's body.
	Payload []byte
	// Attempts counts the failed publications of the event so far, as a dispatcher hands
	// it on or [Outbox.Dead] lists it: those that [DispatcherConfig.MaxAttempts] counts. A
	// publication cut short by its dispatcher's stop, or left unrecorded by a dispatcher
	// that died or lost its lease, is not counted.
	Attempts int
	// CreatedAt is when it was enqueued.
	CreatedAt time.Time
}

// Config configures an [Outbox]. A nil *Config means all defaults.
type Config struct {
	// Schema holds the outbox table, as given to migrate.Up. Defaults to
	// [SchemaDefault].
	Schema string
	// MeterProvider receives the outbox's metrics: publications, failures, dead events,
	// publication durations, and the backlog (counted at each collection from the
	// indexes of pending and dead events, without reading published ones). Defaults to
	// none.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a span per Enqueue call (oncekit.outbox.enqueue) and per
	// publication (oncekit.outbox.publish, linked to the enqueue that created the
	// event), with the OpenTelemetry messaging attributes. Defaults to none.
	TracerProvider trace.TracerProvider
	// Propagator writes the producer's trace context into each event at Enqueue, and
	// reads it back when the event is published, so that the publication's span links to
	// the trace that created the event. Defaults to propagation.TraceContext{} (W3C
	// traceparent and tracestate).
	Propagator propagation.TextMapPropagator
	// Logger receives a line per dead event and per purge. Defaults to discarding them.
	Logger *slog.Logger
	// PublishedRetention is how long a published event is kept: [Outbox.Purge] deletes
	// events published longer ago, and [Outbox.Purgeable] counts them; a negative one is
	// refused. Defaults to [PublishedRetentionDefault].
	PublishedRetention time.Duration
}

// Outbox enqueues and inspects events.
type Outbox struct {
	pool *pgxpool.Pool // nil on several shards
	// shards are the outbox of each shard, for an outbox made by NewSharded; r is the
	// router.
	shards  []*Outbox
	r       *shard.Router
	name    string // the shard's name, on a shard's outbox
	schema  string
	t       string
	audit   string
	channel string
	tel     *telemetry
	// retention is Config.PublishedRetention.
	retention time.Duration
}

// New returns the outbox on pool. Enqueue runs in the caller's transactions, and
// dispatchers take their connections from pool; each running [Dispatcher] also holds one
// connection of its own for LISTEN, outside pool's MaxConns, so a server's
// max_connections must allow for pool's MaxConns plus one per dispatcher.
func New(pool *pgxpool.Pool, cfg *Config) (*Outbox, error) {
	if pool == nil {
		return nil, errors.New("oncekit/outbox: New needs a pool")
	}
	return newOutbox(shard.Single(pool), cfg)
}

func newOutbox(r *shard.Router, cfg *Config) (*Outbox, error) {
	c := config.Of(cfg)
	if c.PublishedRetention < 0 {
		return nil, errors.New("oncekit/outbox: Config.PublishedRetention must not be negative: leave it 0 for the default")
	}
	schema := config.Or(c.Schema, SchemaDefault)
	o := &Outbox{schema: schema, t: pgx.Identifier{schema, "outbox_events"}.Sanitize(),
		audit: pgx.Identifier{schema, "outbox_audit"}.Sanitize(), channel: channelName(schema), r: r,
		retention: config.Or(c.PublishedRetention, PublishedRetentionDefault)}
	if shards := r.Shards(); len(shards) == 1 {
		o.pool, o.name = shards[0].Pool, shards[0].Name
	} else {
		for _, s := range shards {
			view := *o
			view.pool, view.name, view.shards = s.Pool, s.Name, nil
			o.shards = append(o.shards, &view)
		}
	}
	var err error
	if o.tel, err = newTelemetry(&c, o); err != nil {
		return nil, fmt.Errorf("oncekit/outbox: create the instruments: %w", err)
	}
	for _, view := range o.shards {
		view.tel = o.tel
	}
	return o, nil
}

// channelName is the outbox's notification channel: "oncekit_outbox." and the schema,
// or, when that is longer than PostgreSQL's 63-byte identifiers, the start of it and a
// hash of the schema, so that every schema name gets a channel of its own that fits.
func channelName(schema string) string {
	const maxIdent = 63
	name := "oncekit_outbox." + schema
	if len(name) <= maxIdent {
		return name
	}
	sum := sha256.Sum256([]byte(schema))
	suffix := "~" + hex.EncodeToString(sum[:8])
	return name[:maxIdent-len(suffix)] + suffix
}

// Limits of an [Event], checked by [Outbox.Enqueue] before any SQL.
const (
	// MaxTopicLen is the longest topic, in bytes.
	MaxTopicLen = 255
	// MaxOrderingKeyLen is the longest ordering key, in bytes: well within what the
	// index on ordering keys can hold.
	MaxOrderingKeyLen = 1024
)

// Enqueue errors.
var (
	// ErrInvalidEvent: an event breaks a limit (no topic, a topic or ordering key too
	// long, a NUL byte or invalid UTF-8 in either). Nothing was sent.
	ErrInvalidEvent = errors.New("oncekit/outbox: invalid event")
	// ErrDuplicateEvent: an event ID is already in the outbox. Roll the transaction back
	// (the events enqueued before it in the same call are in it) or enqueue a new ID.
	ErrDuplicateEvent = errors.New("oncekit/outbox: an event with this ID is already in the outbox")
	// ErrOrderingKeyDeadlock: two transactions waited for each other's ordering keys
	// (see [Outbox.Enqueue]), and PostgreSQL ended this one. [*OrderingKeyDeadlockError]
	// matches it.
	ErrOrderingKeyDeadlock = errors.New("oncekit/outbox: deadlock on ordering keys")
)

// OrderingKeyDeadlockError reports that this transaction and another waited for each
// other's ordering-key locks, as two producers that enqueue the same keys in opposite
// order across separate Enqueue calls do; PostgreSQL broke the deadlock by aborting this
// transaction. It is retryable: roll the transaction back and run it again. Its
// SQLState is 40P01 (deadlock_detected), so retry loops that retry deadlocks retry it,
// and it unwraps to the *pgconn.PgError.
type OrderingKeyDeadlockError struct {
	Err error
}

func (e *OrderingKeyDeadlockError) Error() string {
	return "oncekit/outbox: this transaction and another waited for each other's ordering keys and PostgreSQL aborted this one (deadlock_detected): " +
		"roll it back and run it again; to avoid it, enqueue a transaction's ordered events in one Enqueue call, or take its keys in the same order in every transaction"
}

// Is matches [ErrOrderingKeyDeadlock].
func (e *OrderingKeyDeadlockError) Is(target error) bool { return target == ErrOrderingKeyDeadlock }

// Unwrap returns the PostgreSQL error.
func (e *OrderingKeyDeadlockError) Unwrap() error { return e.Err }

// SQLState returns "40P01" (deadlock_detected).
func (e *OrderingKeyDeadlockError) SQLState() string { return deadlockDetected }

// deadlockDetected is PostgreSQL's SQLSTATE for a deadlock it broke.
const deadlockDetected = "40P01"

// Enqueue adds events in tx: they exist, and dispatchers wake for them, only if tx
// commits. It returns the events' IDs, generating the missing ones. Events are checked
// against their limits before any SQL ([ErrInvalidEvent]), and a reused event ID is
// reported as [ErrDuplicateEvent] without aborting tx.
//
// An event with an ordering key takes a lock on the key until tx ends: another
// transaction enqueueing for the same key waits for it, so a key's events are in the
// outbox in the order their transactions committed. One call locks its keys in sorted
// order, but two transactions that enqueue the same keys in opposite order across
// separate calls can wait for each other: PostgreSQL then aborts one of them, and
// Enqueue returns an [*OrderingKeyDeadlockError] (retryable: roll back and run the
// transaction again).
//
// Each event keeps the trace context of ctx (through Config.Propagator), and, with a
// TracerProvider, the call has a span of its own whose context is the one kept.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, events ...Event) (ids []uuid.UUID, err error) {
	if tx == nil {
		return nil, errors.New("oncekit/outbox: Enqueue needs the business transaction")
	}
	ids = make([]uuid.UUID, len(events))
	b := &pgx.Batch{}
	var orderingKeys []string
	for i, e := range events {
		if err := checkEvent(e); err != nil {
			return nil, fmt.Errorf("%w %d: %w", ErrInvalidEvent, i, err)
		}
		if e.OrderingKey != "" && !slices.Contains(orderingKeys, e.OrderingKey) {
			orderingKeys = append(orderingKeys, e.OrderingKey)
		}
	}
	// Producers of one ordering key take turns from their Enqueue to their commit, so
	// that a key's events get their outbox order in commit order. Keys are locked in
	// sorted order, so that two producers that each enqueue their keys in one call never
	// wait for each other; across calls, the order is the caller's (see keyLock).
	slices.Sort(orderingKeys)
	for _, k := range orderingKeys {
		b.Queue(keyLock, o.schema+"."+k)
	}
	skip := b.Len()
	for i, e := range events {
		ids[i] = e.ID
		if e.ID == uuid.Nil {
			if ids[i], err = uuid.NewV7(); err != nil {
				return nil, err
			}
		}
	}
	ctx, end := o.tel.enqueue(ctx, events, ids)
	defer func() { end(err) }()
	traceContext := o.tel.traceContext(ctx)
	for i, e := range events {
		e.ID = ids[i]
		var ok *string
		if e.OrderingKey != "" {
			ok = &e.OrderingKey
		}
		payload := e.Payload
		if payload == nil {
			payload = []byte{}
		}
		b.Queue(`INSERT INTO `+o.t+` (id, topic, ordering_key, payload, trace_context) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (id) DO NOTHING`, e.ID, e.Topic, ok, payload, traceContext)
	}
	// Delivered at commit, once per transaction however many events it enqueued.
	b.Queue(`SELECT pg_notify($1, '')`, o.channel)
	br := tx.SendBatch(ctx, b)
	for range skip {
		if _, e := br.Exec(); e != nil {
			err = fmt.Errorf("oncekit/outbox: enqueue: %w", e)
			var pgErr *pgconn.PgError
			if errors.As(e, &pgErr) && pgErr.Code == deadlockDetected {
				err = &OrderingKeyDeadlockError{Err: e}
			}
			break
		}
	}
	for i := 0; err == nil && i < len(events); i++ {
		tag, e := br.Exec()
		if e != nil {
			err = fmt.Errorf("oncekit/outbox: enqueue: %w", e)
			break
		}
		if tag.RowsAffected() == 0 {
			err = fmt.Errorf("%w: event %d (%s)", ErrDuplicateEvent, i, ids[i])
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("oncekit/outbox: enqueue: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// keyLock is the transaction-scoped lock of an ordering key, $1 the schema and key.
// Enqueue and Retry take it, so that a key's outbox order (seq) is the order in which
// its producers committed.
//
// It can deadlock. One Enqueue call takes its keys in sorted order, but a transaction
// that calls Enqueue twice takes the first call's keys before the second's: if one
// transaction enqueues for key a and then b, and another for b and then a, each can hold
// one key and wait for the other. PostgreSQL detects the cycle after deadlock_timeout
// (1 s by default) and aborts one transaction with SQLSTATE 40P01, which Enqueue returns
// as an *OrderingKeyDeadlockError: the aborted transaction rolls back and can run
// again, and the other goes on. Producers that enqueue all of a transaction's ordered
// events in one call, or always in the same key order, never meet it.
const keyLock = "SELECT pg_advisory_xact_lock(hashtextextended('oncekit.outbox.key.' || $1::text, 0))"

// checkEvent checks an event's limits.
func checkEvent(e Event) error {
	switch {
	case e.Topic == "":
		return errors.New("has no topic")
	case len(e.Topic) > MaxTopicLen:
		return fmt.Errorf("has a topic of %d bytes, over %d", len(e.Topic), MaxTopicLen)
	case len(e.OrderingKey) > MaxOrderingKeyLen:
		return fmt.Errorf("has an ordering key of %d bytes, over %d", len(e.OrderingKey), MaxOrderingKeyLen)
	case !storable(e.Topic):
		return errors.New("has a NUL byte or invalid UTF-8 in its topic")
	case !storable(e.OrderingKey):
		return errors.New("has a NUL byte or invalid UTF-8 in its ordering key")
	}
	return nil
}

func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// DeadEvent is an event that kept failing.
type DeadEvent struct {
	Event
	LastError string
}

// Dead lists up to limit dead events, oldest first. limit must be positive.
func (o *Outbox) Dead(ctx context.Context, limit int) ([]DeadEvent, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("oncekit/outbox: Dead needs a positive limit, got %d", limit)
	}
	if o.shards != nil {
		return o.oldestDead(limit, func(v *Outbox) ([]DeadEvent, error) { return v.Dead(ctx, limit) })
	}
	rows, err := o.pool.Query(ctx, `SELECT id, topic, coalesce(ordering_key, ''), payload, attempts, created_at, coalesce(last_error, '')
		FROM `+o.t+` WHERE state = 'dead' ORDER BY seq LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadEvent, error) {
		var d DeadEvent
		err := r.Scan(&d.ID, &d.Topic, &d.OrderingKey, &d.Payload, &d.Attempts, &d.CreatedAt, &d.LastError)
		return d, err
	})
}

// Retry returns a dead event to the pending state with its attempts reset, so
// dispatchers publish it again. It reports whether the event was dead.
//
// The event is enqueued anew: it takes its place at the end of the outbox order, after
// every event enqueued before the retry, and so, under DispatcherConfig.Ordered, it is
// published after the events of its key that overtook it while it was dead and after
// those in flight, never alongside them. Like Enqueue, it takes its ordering key's lock,
// so it waits for a producer of the key whose transaction is open.
func (o *Outbox) Retry(ctx context.Context, id uuid.UUID) (bool, error) {
	if o.shards != nil {
		retried := false
		err := o.each(func(v *Outbox) error {
			ok, err := v.Retry(ctx, id)
			retried = retried || ok
			return err
		})
		return retried, err
	}
	retried := false
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var key *string
		err := tx.QueryRow(ctx, `SELECT ordering_key FROM `+o.t+` WHERE id = $1 AND state = 'dead'`, id).Scan(&key)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if key != nil {
			if _, err := tx.Exec(ctx, keyLock, o.schema+"."+*key); err != nil {
				return err
			}
		}
		// A new place in the outbox order, taken under the key's lock.
		seqs, err := o.newSeqs(ctx, tx, 1)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(o.requeueSQL(), id, seqs[0]).Exec(func(tag pgconn.CommandTag) error {
			retried = tag.RowsAffected() == 1
			return nil
		})
		b.Queue(`SELECT pg_notify($1, '')`, o.channel)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return false, fmt.Errorf("oncekit/outbox: retry %s: %w", id, err)
	}
	return retried, nil
}

// requeueSQL makes the dead event $1 pending again, at the place $2 in the outbox order.
func (o *Outbox) requeueSQL() string {
	return `UPDATE ` + o.t + ` SET state = 'pending', attempts = 0, available_at = now(), last_error = NULL, seq = $2
		WHERE id = $1 AND state = 'dead'`
}

// newSeqs takes n new places in the outbox order, in ascending order. They are taken
// by a statement of their own, not by the UPDATE that uses them (seq = DEFAULT), because
// Citus refuses a volatile function such as nextval in an UPDATE of a table it holds.
func (o *Outbox) newSeqs(ctx context.Context, tx pgx.Tx, n int) ([]int64, error) {
	rows, err := tx.Query(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'seq')) FROM generate_series(1, $2) ORDER BY 1`, o.t, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// Stats counts events by state.
type Stats struct{ Pending, Published, Dead int }

// backlog counts the events not published, from the partial indexes of pending and of
// dead events: its cost follows the backlog, not the published events the table keeps
// until they are purged.
func (o *Outbox) backlog(ctx context.Context) (pending, dead int64, err error) {
	err = o.each(func(v *Outbox) error {
		var p, d int64
		err := v.pool.QueryRow(ctx, v.backlogSQL()).Scan(&p, &d)
		pending, dead = pending+p, dead+d
		return err
	})
	return pending, dead, err
}

func (o *Outbox) backlogSQL() string {
	return `SELECT (SELECT count(*) FROM ` + o.t + ` WHERE state = 'pending'), (SELECT count(*) FROM ` + o.t + ` WHERE state = 'dead')`
}

// Stats counts the events in each state.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := o.each(func(v *Outbox) error {
		var n Stats
		err := v.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'published'),
			count(*) FILTER (WHERE state = 'dead') FROM `+v.t).Scan(&n.Pending, &n.Published, &n.Dead)
		s.Pending, s.Published, s.Dead = s.Pending+n.Pending, s.Published+n.Published, s.Dead+n.Dead
		return err
	})
	return s, err
}

// Defaults of [Config], and the outbox's migration line.
const (
	// SchemaDefault is the schema the outbox's table lives in: the schema of every
	// oncekit table.
	SchemaDefault = config.SchemaDefault
	// MigrationLine names the outbox's line in the oncekit_migrations table.
	MigrationLine = "outbox"
	// PublishedRetentionDefault is how long a published event is kept before a purge
	// may delete it: long enough to look into what was published last week.
	PublishedRetentionDefault = 7 * 24 * time.Hour
)

// Purge deletes published events older than [Config].PublishedRetention, in batches,
// oldest first, on every shard in turn; many purgers may run at once. Pending and dead
// events are never purged.
func (o *Outbox) Purge(ctx context.Context, opts *ledger.PurgeOpts) (ledger.PurgeResult, error) {
	c := config.Of(opts)
	before := time.Now().Add(-o.retention)
	var res ledger.PurgeResult
	err := o.each(func(v *Outbox) error {
		deleted, batches, err := v.purgeSQL().Run(ctx, v.pool, c.BatchSize, c.MaxBatches, c.Pause, before)
		res.Deleted, res.Batches = res.Deleted+deleted, res.Batches+batches
		o.tel.purge(ctx, deleted)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("oncekit/outbox: purge: %w", err)
	}
	return res, nil
}

// purgeSQL is Purge's statements: published events older than $2, oldest first, through
// the index of published events (outbox migration 004).
func (o *Outbox) purgeSQL() pgsql.Purge {
	return pgsql.PurgeSQL(o.t, []string{"id"}, "state = 'published' AND published_at < $2", "published_at")
}

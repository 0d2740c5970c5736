package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pipetx"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

// Defaults of [Config], and the inbox's migration line.
const (
	// SchemaDefault is the schema the inbox's table lives in: the schema of every
	// oncekit table.
	SchemaDefault = config.SchemaDefault
	// MigrationLine names the inbox's line in the oncekit_migrations table.
	MigrationLine = "inbox"
	// RetentionDefault is how long handled messages are remembered: longer than any
	// broker keeps redelivering, and as long as the ledger keeps its records.
	RetentionDefault = 30 * 24 * time.Hour
)

// Mode is when a message's record is answered, relative to the handler.
type Mode int

const (
	// ModeRecordFirst, the zero Mode, records the message in a round trip of its own,
	// with BEGIN and a savepoint, and the answer arrives before the handler is called:
	// a duplicate never calls it. A first delivery whose handler sends one statement
	// takes the three round trips of pgx.BeginFunc.
	ModeRecordFirst Mode = iota
	// ModeRecordWithFirstStatement sends BEGIN, the message's record and the savepoint
	// in the round trip of the handler's first statement: a first delivery whose
	// handler sends one statement takes two round trips. For a duplicate the handler is
	// called, and its first statement, and every later one, returns [ErrDuplicate]
	// without running: nothing it sends through tx takes effect, and the result is
	// Duplicate whatever it returns. A duplicate then costs four round trips instead of
	// two (its batch failed, so the rollback goes alone, and pgx drops the batch's
	// cached statements, which costs the connection's next delivery one more). Use it
	// only for handlers that act through tx alone and do not mind being called for a
	// duplicate; handlers that do can share a pool with these through a second Inbox.
	ModeRecordWithFirstStatement
)

// Config configures an [Inbox]. A nil *Config means all defaults.
type Config struct {
	// Schema holds the inbox table, as given to migrate.Up. Defaults to
	// [SchemaDefault].
	Schema string
	// Retention is how long a handled message is remembered; a negative one is refused.
	// Defaults to [RetentionDefault].
	Retention time.Duration
	// MeterProvider receives the inbox's metrics: messages by outcome (handled,
	// duplicate, rejected, error) and purge deletions. Defaults to none.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a span per Handle call (oncekit.inbox.handle), a child of
	// the caller's span, with the OpenTelemetry messaging attributes. Defaults to none.
	TracerProvider trace.TracerProvider
	// Logger receives a line per purge. Defaults to discarding it.
	Logger *slog.Logger
	// Mode is when the message's record is answered, relative to the handler.
	// Defaults to [ModeRecordFirst]: before the handler is called.
	Mode Mode
}

// Errors of the inbox.
var (
	// ErrDuplicate is what the statements of a handler return under
	// ModeRecordWithFirstStatement when the message turns out to have been handled
	// before. Return it (or any error): the inbox reports the delivery as a duplicate
	// either way.
	ErrDuplicate = errors.New("oncekit/inbox: the message was handled before: return this error")
	// ErrNoTenant: Handle on an inbox of several shards was given a context without
	// the message's tenant.
	ErrNoTenant = errors.New("oncekit/inbox: the inbox is on several shards and the context carries no tenant: put the message's tenant in it with keys.WithTenant")
	// ErrNilHandler: Handle or HandleTx was given no handler.
	ErrNilHandler = errors.New("oncekit/inbox: nil handler: pass the function that handles the message")
)

// Inbox tracks processed messages.
type Inbox struct {
	r *shard.Router
	// sharded is true for an inbox made by NewSharded, whose Handle needs the tenant.
	sharded bool
	cfg     Config
	q       queries
	tel     *telemetry
}

// New returns an inbox on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("oncekit/inbox: New needs a pool")
	}
	return newInbox(shard.Single(pool), false, cfg)
}

// NewSharded returns an inbox on the shards of r, each migrated: Handle records a
// message on the shard of the tenant that keys.WithTenant put in its context, beside
// the handler's writes to that tenant's tables, and without a tenant returns
// [ErrNoTenant]. HandleTx records it where the caller's transaction is, and refuses
// one that is not on the shard of the tenant its context carries with a
// *shard.WrongShardError. Stats and Purge run on every shard in turn.
func NewSharded(r *shard.Router, cfg *Config) (*Inbox, error) {
	if r == nil {
		return nil, errors.New("oncekit/inbox: NewSharded needs a router")
	}
	return newInbox(r, true, cfg)
}

func newInbox(r *shard.Router, sharded bool, cfg *Config) (*Inbox, error) {
	c := config.Of(cfg)
	c.Schema = config.Or(c.Schema, SchemaDefault)
	c.Retention = config.Or(c.Retention, RetentionDefault)
	if c.Mode < ModeRecordFirst || c.Mode > ModeRecordWithFirstStatement {
		return nil, fmt.Errorf("oncekit/inbox: Config.Mode %d is not a Mode: use ModeRecordFirst or ModeRecordWithFirstStatement", int(c.Mode))
	}
	if c.Retention < 0 {
		return nil, fmt.Errorf("oncekit/inbox: Config.Retention %s is negative: it would make every record born expired and every duplicate handled again; use 0 for the default (%s)", c.Retention, RetentionDefault)
	}
	tel, err := newTelemetry(&c)
	if err != nil {
		return nil, fmt.Errorf("oncekit/inbox: create the instruments: %w", err)
	}
	return &Inbox{r: r, sharded: sharded, cfg: c, q: newQueries(c.Schema), tel: tel}, nil
}

// pool returns the pool of the shard of the tenant ctx carries.
func (ib *Inbox) pool(ctx context.Context) (*pgxpool.Pool, error) {
	tenant, ok := keys.TenantFrom(ctx)
	if !ok && ib.sharded {
		return nil, ErrNoTenant
	}
	return ib.r.Pool(tenant)
}

// Result is the outcome of [Inbox.Handle].
type Result struct {
	// Duplicate is true when the message had been handled (or rejected) before and
	// nothing the handler sent took effect (under ModeRecordWithFirstStatement it was called, but
	// its statements did not run): ack it.
	Duplicate bool
	// Rejected is true when the handler refused the message definitively, now or before.
	Rejected bool
}

// HandlerFunc handles a message inside the inbox's transaction.
type HandlerFunc func(ctx context.Context, tx pgx.Tx) error

// Handle runs fn for the message unless subscriber has handled it before. On a nil
// error, ack the message; on an error, do not (the broker redelivers it). A redelivery
// that arrives while the same message is being handled waits for that transaction to
// end, then is a duplicate (or, if it rolled back, handled).
func (ib *Inbox) Handle(ctx context.Context, subscriber, messageID string, fn HandlerFunc) (res Result, err error) {
	ctx, end := ib.tel.handle(ctx, subscriber, messageID)
	defer func() { end(res, err) }()
	if err := validate(subscriber, messageID, fn); err != nil {
		return Result{}, err
	}
	pool, err := ib.pool(ctx)
	if err != nil {
		return Result{}, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Result{}, err
	}
	defer conn.Release()
	c := conn.Conn()
	if ib.cfg.Mode == ModeRecordWithFirstStatement {
		return ib.handleFirst(ctx, c, subscriber, messageID, fn)
	}
	// BEGIN, the record and the savepoint that fences fn travel in one round trip, as
	// prepared statements.
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(ib.q.insert, subscriber, messageID, pgsql.Interval(ib.cfg.Retention))
	b.Queue("SAVEPOINT oncekit_inbox_fn")
	br := c.SendBatch(ctx, b)
	tx := br.Tx()
	recorded, err := recordResult(br)
	if err != nil {
		if rbErr := rollback(context.WithoutCancel(ctx), c); rbErr != nil {
			err = errors.Join(err, rbErr)
		}
		return Result{}, fmt.Errorf("oncekit/inbox: record %q: %w", messageID, err)
	}
	if !recorded {
		// On the held connection: no second one from the pool.
		return ib.duplicate(ctx, c, subscriber, messageID, "ROLLBACK")
	}
	return ib.run(ctx, tx, subscriber, messageID, fn,
		func(ctx context.Context) error { return commitErr(subscriber, messageID, tx.Commit(ctx)) },
		func(ctx context.Context) error { return tx.Rollback(ctx) })
}

// commitErr is the error of the commit of the message's record: a lost answer is an
// [*ledger.OutcomeUnknownError], scoped by the subscriber, whose key is the message ID.
func commitErr(subscriber, messageID string, err error) error {
	if !pgsql.CommitUnknown(err) {
		return err
	}
	return &ledger.OutcomeUnknownError{Scope: keys.Scope{Tenant: subscriber, Operation: "inbox"}, Key: keys.Key(messageID), Err: err}
}

// recordResult reads the results of a batch of three whose second statement is the
// record's INSERT, and reports whether it recorded the message.
func recordResult(br pgx.BatchResults) (bool, error) {
	var tag pgconn.CommandTag
	var err error
	for i := range 3 {
		var t pgconn.CommandTag
		if t, err = br.Exec(); err != nil {
			break
		}
		if i == 1 {
			tag = t
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected() == 1, err
}

// HandleTx is [Inbox.Handle] inside the caller's transaction: the record and fn's writes
// commit with it. A duplicate, or any failure, leaves tx as it was before the call, and
// usable.
func (ib *Inbox) HandleTx(ctx context.Context, tx pgx.Tx, subscriber, messageID string, fn HandlerFunc) (res Result, err error) {
	defer func() { ib.tel.message(ctx, subscriber, res, err) }()
	if err := validate(subscriber, messageID, fn); err != nil {
		return Result{}, err
	}
	if ib.sharded && tx != nil {
		if tenant, ok := keys.TenantFrom(ctx); ok {
			if err := ib.r.Check(tenant, tx.Conn()); err != nil {
				return Result{}, err
			}
		}
	}
	undo := func(ctx context.Context) error {
		// One simple-protocol query, which an aborted transaction accepts.
		_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_inbox; RELEASE SAVEPOINT oncekit_inbox")
		return err
	}
	if ib.cfg.Mode == ModeRecordWithFirstStatement {
		return ib.handleTxFirst(ctx, tx, subscriber, messageID, fn, undo)
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_inbox")
	b.Queue(ib.q.insert, subscriber, messageID, pgsql.Interval(ib.cfg.Retention))
	b.Queue("SAVEPOINT oncekit_inbox_fn")
	recorded, err := recordResult(tx.SendBatch(ctx, b))
	if err != nil {
		if rbErr := undo(context.WithoutCancel(ctx)); rbErr != nil {
			err = errors.Join(err, rbErr)
		}
		return Result{}, fmt.Errorf("oncekit/inbox: record %q: %w", messageID, err)
	}
	if !recorded {
		return ib.duplicate(ctx, tx, subscriber, messageID, "ROLLBACK TO SAVEPOINT oncekit_inbox", "RELEASE SAVEPOINT oncekit_inbox")
	}
	return ib.run(ctx, tx, subscriber, messageID, fn,
		func(ctx context.Context) error {
			_, err := tx.Exec(ctx, "RELEASE SAVEPOINT oncekit_inbox")
			return err
		}, undo)
}

// handleFirst is Handle under ModeRecordWithFirstStatement, on the held connection c.
func (ib *Inbox) handleFirst(ctx context.Context, c *pgx.Conn, subscriber, messageID string, fn HandlerFunc) (res Result, err error) {
	p := ib.pipe(c, true, subscriber, messageID)
	res, err = ib.run(ctx, p, subscriber, messageID, fn,
		func(ctx context.Context) error {
			if !p.Sent() {
				// fn sent nothing: the record travels with COMMIT.
				_, err := p.Exec(ctx, "COMMIT")
				if p.Refused() {
					return err
				}
				return commitErr(subscriber, messageID, err)
			}
			// Commit, not an Exec of COMMIT: it reports a transaction fn left aborted,
			// which PostgreSQL ends with a rollback.
			return commitErr(subscriber, messageID, p.Current().Commit(ctx))
		},
		func(ctx context.Context) error { return rollback(ctx, c) })
	if !p.Refused() {
		return res, err
	}
	// run has rolled the transaction back: the record's statement failed and aborted
	// it, so the read could not travel with the rollback.
	return ib.duplicate(ctx, c, subscriber, messageID)
}

// rollback ends c's transaction, if it is in one. ROLLBACK without arguments travels
// with the simple protocol, which an aborted transaction accepts.
func rollback(ctx context.Context, c *pgx.Conn) error {
	if c.PgConn().TxStatus() == 'I' {
		return nil
	}
	ctx, cancel := pgsql.Cleanup(ctx)
	defer cancel()
	_, err := c.Exec(ctx, "ROLLBACK")
	return err
}

// handleTxFirst is HandleTx under ModeRecordWithFirstStatement; undo rolls back to
// where the call began.
func (ib *Inbox) handleTxFirst(ctx context.Context, tx pgx.Tx, subscriber, messageID string, fn HandlerFunc,
	undo func(context.Context) error) (Result, error) {
	p := ib.pipe(tx, false, subscriber, messageID)
	sentUndo := func(ctx context.Context) error {
		if !p.Sent() {
			return nil
		}
		return undo(ctx)
	}
	res, err := ib.run(ctx, p, subscriber, messageID, fn,
		func(ctx context.Context) error {
			_, err := p.Exec(ctx, "RELEASE SAVEPOINT oncekit_inbox")
			return err
		}, sentUndo)
	if !p.Refused() {
		return res, err
	}
	// run has rolled back to the savepoint before the record.
	return ib.duplicate(ctx, tx, subscriber, messageID)
}

// pipe is the transaction a ModeRecordWithFirstStatement handler runs in: the message's record, fenced
// by savepoints, travels with the handler's first statement (and BEGIN when begin is
// set; otherwise a savepoint to undo the call to).
func (ib *Inbox) pipe(via pipetx.Sender, begin bool, subscriber, messageID string) *pipetx.Tx {
	prefix := []*pgx.QueuedQuery{pipetx.Queued(ib.q.claim, subscriber, messageID, pgsql.Interval(ib.cfg.Retention)),
		pipetx.Queued("SAVEPOINT oncekit_inbox_fn")}
	claimAt := 0
	if !begin {
		prefix = append([]*pgx.QueuedQuery{pipetx.Queued("SAVEPOINT oncekit_inbox")}, prefix...)
		claimAt = 1
	}
	return pipetx.New(pipetx.Config{Via: via, Begin: begin, Prefix: prefix, ClaimAt: claimAt,
		Refused: ErrDuplicate, Managed: ledger.ErrManagedTx})
}

// run calls fn and finishes: commit on success, record a rejection on a definitive
// failure, roll back on any other error.
func (ib *Inbox) run(ctx context.Context, tx pgx.Tx, subscriber, messageID string, fn HandlerFunc,
	finish, rollback func(context.Context) error) (res Result, err error) {
	undo := func() error {
		cleanup, cancel := pgsql.Cleanup(ctx)
		defer cancel()
		return rollback(cleanup)
	}
	fail := func(err error) (Result, error) {
		if rbErr := undo(); rbErr != nil {
			return Result{}, errors.Join(err, rbErr)
		}
		return Result{}, err
	}
	defer func() {
		if p := recover(); p != nil {
			_ = undo()
			panic(p)
		}
	}()
	fnErr := fn(ctx, tx)
	var derr *ledger.DefinitiveError
	switch {
	case fnErr == nil:
	case errors.As(fnErr, &derr):
		// The rollback to the savepoint goes alone, with the simple protocol: fn may have
		// left the transaction aborted, where PostgreSQL refuses to prepare the UPDATE.
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_inbox_fn"); err != nil {
			return fail(err)
		}
		if _, err := tx.Exec(ctx, ib.q.reject, subscriber, messageID, derr.Error()); err != nil {
			return fail(err)
		}
		res.Rejected = true
	default:
		return fail(fnErr)
	}
	if err := finish(ctx); err != nil {
		if errors.Is(err, ledger.ErrOutcomeUnknown) {
			// The connection is gone with the transaction: nothing to roll back.
			return Result{}, err
		}
		return fail(err)
	}
	if res.Rejected {
		return res, fnErr
	}
	return res, nil
}

// duplicate sends undo, the statements that end the call's transaction (or roll back
// to its savepoint), and reads whether the message was rejected, in one round trip. The
// record met a live one, so the message was handled within its retention: a duplicate,
// even if a purge removed the record since (it is then reported as not rejected).
func (ib *Inbox) duplicate(ctx context.Context, q pipetx.Sender, subscriber, messageID string, undo ...string) (Result, error) {
	b := &pgx.Batch{}
	for _, sql := range undo {
		b.Queue(sql)
	}
	b.Queue(ib.q.lookup, subscriber, messageID)
	br := q.SendBatch(ctx, b)
	var err error
	for range undo {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	var state string
	if err == nil {
		if err = br.QueryRow().Scan(&state); errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("oncekit/inbox: read the record of %q: %w", messageID, err)
	}
	return Result{Duplicate: true, Rejected: state == "rejected"}, nil
}

// queries holds the inbox's SQL with the schema filled in; each takes $1 subscriber
// and $2 message ID.
type queries struct {
	insert, claim, lookup, reject string
	purge                         pgsql.Purge
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "inbox_messages"}.Sanitize()
	// $3 retention. An expired record is taken over: the message is new again. A live
	// one leaves the INSERT without a row; a concurrent delivery's uncommitted record
	// makes it wait for that transaction. The conflict branch reads the time from the row
	// it would have inserted, not from now(), which Citus refuses there.
	insert := `INSERT INTO ` + t + ` AS r (subscriber, message_id, received_at, expires_at) VALUES ($1, $2, now(), now() + $3::interval)
			ON CONFLICT (subscriber, message_id) DO UPDATE SET state = 'processed', error = NULL,
				received_at = excluded.received_at, expires_at = excluded.expires_at
			WHERE r.expires_at <= excluded.received_at`
	return queries{
		insert: insert,
		// insert as a claim for a pipeline: it fails, dividing by zero, when the
		// message has a live record, which makes PostgreSQL skip the statements sent
		// behind it.
		claim:  `WITH recorded AS (` + insert + ` RETURNING 1) SELECT 1 / count(*)::int FROM recorded`,
		lookup: `SELECT state FROM ` + t + ` WHERE subscriber = $1 AND message_id = $2`,
		// $3 the rejection.
		reject: `UPDATE ` + t + ` SET state = 'rejected', error = $3 WHERE subscriber = $1 AND message_id = $2`,
		// $1 batch size.
		purge: pgsql.PurgeSQL(t, []string{"subscriber", "message_id"}, "expires_at <= now()", "expires_at"),
	}
}

// Purge deletes expired records in batches, oldest first, on every shard in turn; many
// purgers may run at once.
func (ib *Inbox) Purge(ctx context.Context, opts *ledger.PurgeOpts) (ledger.PurgeResult, error) {
	o := config.Of(opts)
	var res ledger.PurgeResult
	err := ib.r.Each(func(s shard.Shard) error {
		deleted, batches, err := ib.q.purge.Run(ctx, s.Pool, o.BatchSize, o.MaxBatches, o.Pause)
		res.Deleted, res.Batches = res.Deleted+deleted, res.Batches+batches
		ib.tel.purge(ctx, deleted)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("oncekit/inbox: purge: %w", err)
	}
	return res, nil
}

func validate(subscriber, messageID string, fn HandlerFunc) error {
	if fn == nil {
		return ErrNilHandler
	}
	var ve *keys.ValidationError
	if err := (keys.Scope{Tenant: subscriber, Operation: "inbox"}).Validate(); errors.As(err, &ve) {
		return fmt.Errorf("oncekit/inbox: the subscriber name must be 1 to %d bytes of printable ASCII (%w): name each consumer with a fixed string",
			keys.MaxScopeLen, ve.Err)
	}
	if err := keys.Key(messageID).Validate(); errors.As(err, &ve) {
		return fmt.Errorf("oncekit/inbox: the message ID must be 1 to %d bytes of printable ASCII (%w, %d bytes): pass the broker's message ID, or a hash of a longer one",
			keys.MaxLenDefault, ve.Err, len(messageID))
	}
	return nil
}

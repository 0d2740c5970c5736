// Package inbox is processed-message tracking for consumers: a message is handled at
// most once per subscriber, in the same transaction as the handler's writes.
//
// [Inbox.Handle] begins a transaction, records (subscriber, message ID) under a unique
// constraint, and runs the handler. A message already recorded is detected in that
// transaction and skipped, and the caller acks it. A handler that fails rolls back,
// record included, so the message is handled again on redelivery; a handler that
// returns a definitive failure (ledger.Definitive) has its writes undone and the message
// recorded as rejected, so a poison message is not retried forever.
//
// Delivery from a broker or an outbox is at least once; the inbox turns it into one
// effect. Records are kept for [Config].Retention and purged in batches by
// [Inbox.Purge]; a redelivery after that is handled as new. The table is created by
// ledger.Migrate.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// RetentionDefault is how long handled messages are remembered: longer than any broker
// keeps redelivering.
const RetentionDefault = 14 * 24 * time.Hour

// Config configures an [Inbox]. A nil *Config means all defaults.
type Config struct {
	// Schema holds the inbox table, as given to ledger.Migrate. Defaults to
	// ledger.SchemaDefault.
	Schema string
	// Retention is how long a handled message is remembered. Defaults to
	// [RetentionDefault].
	Retention time.Duration
}

// Inbox tracks processed messages.
type Inbox struct {
	pool *pgxpool.Pool
	cfg  Config
	t    string
}

// New returns an inbox on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("oncekit/inbox: New needs a pool")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = ledger.SchemaDefault
	}
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	return &Inbox{pool: pool, cfg: c, t: pgx.Identifier{c.Schema, "inbox_messages"}.Sanitize()}, nil
}

// Result is the outcome of [Inbox.Handle].
type Result struct {
	// Duplicate is true when the message had been handled (or rejected) before and the
	// handler did not run: ack it.
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
func (ib *Inbox) Handle(ctx context.Context, subscriber, messageID string, fn HandlerFunc) (Result, error) {
	if err := validate(subscriber, messageID, fn); err != nil {
		return Result{}, err
	}
	conn, err := ib.pool.Acquire(ctx)
	if err != nil {
		return Result{}, err
	}
	defer conn.Release()
	// BEGIN and the record travel in one round trip; a duplicate fails the INSERT.
	tx, err := pgsql.BeginScript(ctx, conn.Conn(), ib.claimScript(subscriber, messageID))
	if err != nil {
		if pgsql.IsUniqueViolation(err, "inbox_messages_pkey") {
			return ib.previousIn(ctx, conn.Conn(), subscriber, messageID) // on the held connection: no second one from the pool
		}
		return Result{}, err
	}
	return ib.run(ctx, tx, subscriber, messageID, fn,
		func(ctx context.Context) error { return tx.Commit(ctx) },
		func(ctx context.Context) { _ = tx.Rollback(ctx) })
}

// HandleTx is [Inbox.Handle] inside the caller's transaction: the record and fn's writes
// commit with it. A duplicate leaves tx as it was.
func (ib *Inbox) HandleTx(ctx context.Context, tx pgx.Tx, subscriber, messageID string, fn HandlerFunc) (Result, error) {
	if err := validate(subscriber, messageID, fn); err != nil {
		return Result{}, err
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_inbox")
	b.Queue(`DELETE FROM `+ib.t+` WHERE subscriber = $1 AND message_id = $2 AND expires_at <= now()`, subscriber, messageID)
	b.Queue(`INSERT INTO `+ib.t+` (subscriber, message_id, received_at, expires_at) VALUES ($1, $2, now(), now() + $3::interval)
		ON CONFLICT DO NOTHING`, subscriber, messageID, pgsql.Interval(ib.cfg.Retention))
	b.Queue("SAVEPOINT oncekit_inbox_fn")
	res := tx.SendBatch(ctx, b)
	var inserted bool
	var err error
	for i := range b.Len() {
		tag, e := res.Exec()
		if e != nil {
			err = e
			break
		}
		if i == 2 {
			inserted = tag.RowsAffected() == 1
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_, _ = tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT oncekit_inbox")
		return Result{}, err
	}
	if !inserted {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_inbox"); err != nil {
			return Result{}, err
		}
		return ib.previousIn(ctx, tx, subscriber, messageID)
	}
	return ib.run(ctx, tx, subscriber, messageID, fn,
		func(ctx context.Context) error {
			_, err := tx.Exec(ctx, "RELEASE SAVEPOINT oncekit_inbox")
			return err
		},
		func(ctx context.Context) {
			_ = tx.SendBatch(ctx, batchOf("ROLLBACK TO SAVEPOINT oncekit_inbox", "RELEASE SAVEPOINT oncekit_inbox")).Close()
		})
}

func batchOf(stmts ...string) *pgx.Batch {
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s)
	}
	return b
}

// run calls fn and finishes: commit on success, record a rejection on a definitive
// failure, roll back on any other error.
func (ib *Inbox) run(ctx context.Context, tx pgx.Tx, subscriber, messageID string, fn HandlerFunc,
	finish func(context.Context) error, rollback func(context.Context)) (res Result, err error) {
	undo := func() { rollback(context.WithoutCancel(ctx)) }
	defer func() {
		if p := recover(); p != nil {
			undo()
			panic(p)
		}
	}()
	fnErr := fn(ctx, tx)
	var derr *ledger.DefinitiveError
	switch {
	case fnErr == nil:
	case errors.As(fnErr, &derr):
		b := &pgx.Batch{}
		b.Queue("ROLLBACK TO SAVEPOINT oncekit_inbox_fn")
		b.Queue(`UPDATE `+ib.t+` SET state = 'rejected', error = $3 WHERE subscriber = $1 AND message_id = $2`, subscriber, messageID, derr.Error())
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			undo()
			return Result{}, err
		}
		res.Rejected = true
	default:
		undo()
		return Result{}, fnErr
	}
	if err := finish(ctx); err != nil {
		undo()
		return Result{}, err
	}
	if res.Rejected {
		return res, fnErr
	}
	return res, nil
}

// claimScript begins the transaction and records the message: an expired record makes
// way first, and a live one fails the INSERT with a unique violation. Interpolated
// values are validated printable ASCII.
func (ib *Inbox) claimScript(subscriber, messageID string) string {
	pk := "subscriber = " + pgsql.QuoteLiteral(subscriber) + " AND message_id = " + pgsql.QuoteLiteral(messageID)
	return "BEGIN; DELETE FROM " + ib.t + " WHERE " + pk + " AND expires_at <= now(); " +
		"INSERT INTO " + ib.t + " (subscriber, message_id, received_at, expires_at) VALUES (" + pgsql.QuoteLiteral(subscriber) + ", " +
		pgsql.QuoteLiteral(messageID) + ", now(), now() + interval '" + pgsql.Interval(ib.cfg.Retention) + "'); SAVEPOINT oncekit_inbox_fn"
}

func (ib *Inbox) previousIn(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, subscriber, messageID string) (Result, error) {
	var state string
	err := q.QueryRow(ctx, `SELECT state FROM `+ib.t+` WHERE subscriber = $1 AND message_id = $2`, subscriber, messageID).Scan(&state)
	if err != nil {
		return Result{}, fmt.Errorf("oncekit/inbox: read the record of %q: %w", messageID, err)
	}
	return Result{Duplicate: true, Rejected: state == "rejected"}, nil
}

// PurgeOpts are options of [Inbox.Purge]. A nil *PurgeOpts means all defaults.
type PurgeOpts struct {
	// BatchSize bounds one statement. Defaults to ledger.PurgeBatchDefault.
	BatchSize int
}

// Purge deletes expired records in batches; many purgers may run at once.
func (ib *Inbox) Purge(ctx context.Context, opts *PurgeOpts) (int64, error) {
	n := ledger.PurgeBatchDefault
	if opts != nil && opts.BatchSize > 0 {
		n = opts.BatchSize
	}
	deleted, _, err := pgsql.DeleteBatches(ctx, ib.pool, `DELETE FROM `+ib.t+` WHERE ctid = ANY (ARRAY (
		SELECT ctid FROM `+ib.t+` WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))`, n, 0, n)
	return deleted, err
}

func validate(subscriber, messageID string, fn HandlerFunc) error {
	if fn == nil {
		return ledger.ErrNilFunc
	}
	if err := (keys.Scope{Tenant: subscriber, Operation: "inbox"}).Validate(); err != nil {
		return fmt.Errorf("oncekit/inbox: subscriber: %w", err)
	}
	if err := keys.Key(messageID).Validate(); err != nil {
		return fmt.Errorf("oncekit/inbox: message ID: %w", err)
	}
	return nil
}

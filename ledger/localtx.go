package ledger

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ownTx is the ledger's own transaction on a pooled connection. It spends no round trip
// of its own: BEGIN travels with the claim, and COMMIT with the stored result.
type ownTx struct {
	l    *Ledger
	conn *pgx.Conn
	t    pgx.Tx
}

func (o *ownTx) q() querier { return o.conn }
func (o *ownTx) tx() pgx.Tx { return o.t }

// claim begins the transaction and claims the key in one round trip: the simple query
// protocol runs the whole script at once. A live record makes the INSERT fail with a
// unique violation, which leaves the connection in an aborted transaction to roll back.
func (o *ownTx) claim(ctx context.Context, in Intent, retention, wait time.Duration) (bool, error) {
	if o.conn.PgConn().ParameterStatus("standard_conforming_strings") != "on" {
		return false, errors.New("oncekit/ledger: the connection must have standard_conforming_strings=on (the PostgreSQL default)")
	}
	t, err := o.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: o.l.claimScript(in, retention, wait)})
	if err != nil {
		if o.conn.PgConn().TxStatus() != 'I' {
			if _, rbErr := o.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rbErr != nil {
				return false, errors.Join(err, rbErr)
			}
		}
		if isOwnConflict(err) {
			return false, nil
		}
		return false, err
	}
	o.t = t
	return true, nil
}

// claimScript renders the claim as one script of literal SQL. Every interpolated value
// is validated printable ASCII or a number.
func (l *Ledger) claimScript(in Intent, retention, wait time.Duration) string {
	now := "now()"
	if t := l.now(); t != nil {
		now = quoteLiteral(t.UTC().Format(time.RFC3339Nano)) + "::timestamptz"
	}
	pk := "tenant = " + quoteLiteral(in.Scope.Tenant) + " AND operation = " + quoteLiteral(in.Scope.Operation) +
		" AND key = " + quoteLiteral(string(in.Key))
	var b strings.Builder
	b.WriteString("BEGIN; SET LOCAL lock_timeout = '" + lockTimeout(wait) + "';\n")
	b.WriteString("DELETE FROM " + l.q.table + " WHERE " + pk + " AND expires_at <= " + now + ";\n")
	b.WriteString("INSERT INTO " + l.q.table + " (tenant, operation, key, fingerprint, state, attempts, created_at, updated_at, expires_at) VALUES (")
	b.WriteString(quoteLiteral(in.Scope.Tenant) + ", " + quoteLiteral(in.Scope.Operation) + ", " + quoteLiteral(string(in.Key)) + ", ")
	b.WriteString(quoteLiteral(string(in.Fingerprint)) + ", 'pending', 1, " + now + ", " + now + ", " + now + " + interval '" + interval(retention) + "');\n")
	b.WriteString("SET LOCAL lock_timeout TO DEFAULT; SAVEPOINT oncekit_fn")
	return b.String()
}

// commit sends the result and COMMIT in one round trip.
func (o *ownTx) commit(ctx context.Context, in Intent, resp Response) error {
	b := &pgx.Batch{}
	b.Queue(o.l.q.completeLocal, in.Scope.Tenant, in.Scope.Operation, string(in.Key), resp.Code, resp.Body, nullable(resp.ResourceRef))
	b.Queue("COMMIT")
	return o.finish(ctx, b)
}

func (o *ownTx) commitFailure(ctx context.Context, in Intent, derr *DefinitiveError) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT oncekit_fn")
	b.Queue(o.l.q.failLocal, in.Scope.Tenant, in.Scope.Operation, string(in.Key), derr.Code, derr.Message)
	b.Queue("COMMIT")
	return o.finish(ctx, b)
}

// finish runs a batch that ends in COMMIT. The pgx.Tx handed to fn is done with after
// it; it is not committed through pgx because that would cost a round trip of its own.
func (o *ownTx) finish(ctx context.Context, b *pgx.Batch) error {
	if o.conn.PgConn().TxStatus() != 'T' {
		return ErrManagedTx
	}
	res := o.conn.SendBatch(ctx, b)
	var last string
	var err error
	for range b.Len() {
		tag, e := res.Exec()
		if e != nil {
			err = e
			break
		}
		last = tag.String()
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err == nil && last != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	if err == nil {
		o.t = nil
	}
	return err
}

func (o *ownTx) abort(ctx context.Context) error {
	if o.t == nil {
		return nil
	}
	t := o.t
	o.t = nil
	if o.conn.PgConn().TxStatus() == 'I' {
		return nil
	}
	return t.Rollback(ctx)
}

// callerTx runs inside the caller's transaction, fenced by savepoints so that a failure
// undoes only what the ledger did.
type callerTx struct {
	l     *Ledger
	outer pgx.Tx
}

func (c *callerTx) q() querier { return c.outer }
func (c *callerTx) tx() pgx.Tx { return c.outer }

func (c *callerTx) claim(ctx context.Context, in Intent, retention, wait time.Duration) (bool, error) {
	pk := []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), c.l.now()}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_claim")
	// Keep the caller's lock_timeout to restore it after the claim.
	b.Queue("SELECT set_config('oncekit.saved_lock_timeout', current_setting('lock_timeout'), true)")
	b.Queue("SELECT set_config('lock_timeout', $1, true)", lockTimeout(wait))
	b.Queue(c.l.q.deleteExpired(), pk...)
	b.Queue(c.l.q.insertLocal, append(pk, string(in.Fingerprint), interval(retention))...)
	b.Queue("SELECT set_config('lock_timeout', current_setting('oncekit.saved_lock_timeout'), true)")
	b.Queue("SAVEPOINT oncekit_fn")
	res := c.outer.SendBatch(ctx, b)
	var claimed bool
	var err error
	for i := range b.Len() {
		tag, e := res.Exec()
		if e != nil {
			err = e
			break
		}
		if i == 4 {
			claimed = tag.RowsAffected() == 1
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = c.run(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT oncekit_claim", "RELEASE SAVEPOINT oncekit_claim")
		return false, err
	}
	if !claimed {
		return false, c.run(ctx, "RELEASE SAVEPOINT oncekit_claim")
	}
	return true, nil
}

func (c *callerTx) commit(ctx context.Context, in Intent, resp Response) error {
	b := &pgx.Batch{}
	b.Queue(c.l.q.completeLocal, in.Scope.Tenant, in.Scope.Operation, string(in.Key), resp.Code, resp.Body, nullable(resp.ResourceRef))
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	return c.l.sendAll(ctx, c.outer, b)
}

func (c *callerTx) commitFailure(ctx context.Context, in Intent, derr *DefinitiveError) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT oncekit_fn")
	b.Queue(c.l.q.failLocal, in.Scope.Tenant, in.Scope.Operation, string(in.Key), derr.Code, derr.Message)
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	return c.l.sendAll(ctx, c.outer, b)
}

func (c *callerTx) abort(ctx context.Context) error {
	return c.run(ctx, "ROLLBACK TO SAVEPOINT oncekit_claim", "RELEASE SAVEPOINT oncekit_claim")
}

func (c *callerTx) run(ctx context.Context, stmts ...string) error {
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s)
	}
	return c.l.sendAll(ctx, c.outer, b)
}

// sendAll runs a batch and returns its first error.
func (l *Ledger) sendAll(ctx context.Context, q querier, b *pgx.Batch) error {
	res := q.SendBatch(ctx, b)
	var err error
	for range b.Len() {
		if _, e := res.Exec(); e != nil {
			err = e
			break
		}
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return err
}

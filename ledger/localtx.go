package ledger

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
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

// claim begins the transaction and claims the key in one round trip: BEGIN, the claim
// and the savepoint that fences fn's writes travel as one simple-protocol script. A live
// record makes the claim fail with a unique violation, which leaves the connection in an
// aborted transaction to roll back.
func (o *ownTx) claim(ctx context.Context, in Intent, wait time.Duration) (bool, error) {
	t, err := pgsql.BeginScript(ctx, o.conn, o.l.claimScript(in, wait))
	if err == nil {
		o.t = t
		return true, nil
	}
	if isOwnConflict(err) {
		return false, nil
	}
	return false, err
}

// claimScript renders the claim as one script. Every interpolated value is validated
// printable ASCII or a number.
func (l *Ledger) claimScript(in Intent, wait time.Duration) string {
	now := "NULL"
	if t := l.now(); t != nil {
		now = pgsql.QuoteLiteral(t.UTC().Format(time.RFC3339Nano))
	}
	return "BEGIN; SELECT " + l.q.claimFunc + "(" + pgsql.QuoteLiteral(in.Scope.Tenant) + ", " +
		pgsql.QuoteLiteral(in.Scope.Operation) + ", " + pgsql.QuoteLiteral(string(in.Key)) + ", " + now + ", " +
		strconv.FormatInt(waitMillis(wait), 10) + "); SAVEPOINT oncekit_fn"
}

// commit inserts the completed record and commits, in one round trip.
func (o *ownTx) commit(ctx context.Context, in Intent, resp Response, retention time.Duration) error {
	b := &pgx.Batch{}
	b.Queue(o.l.q.insertCompleted, o.l.completedArgs(in, resp, retention)...)
	b.Queue("COMMIT")
	return o.finish(ctx, b)
}

func (o *ownTx) commitFailure(ctx context.Context, in Intent, derr *DefinitiveError, retention time.Duration) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT oncekit_fn")
	b.Queue(o.l.q.insertFailed, o.l.failedArgs(in, derr, retention)...)
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

func (c *callerTx) claim(ctx context.Context, in Intent, wait time.Duration) (bool, error) {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_claim")
	b.Queue("SELECT "+c.l.q.claimFunc+"($1, $2, $3, $4, $5)",
		in.Scope.Tenant, in.Scope.Operation, string(in.Key), c.l.now(), waitMillis(wait))
	b.Queue("SAVEPOINT oncekit_fn")
	if err := c.l.sendAll(ctx, c.outer, b); err != nil {
		if rbErr := c.abort(context.WithoutCancel(ctx)); rbErr != nil {
			return false, errors.Join(err, rbErr)
		}
		if isOwnConflict(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func (c *callerTx) commit(ctx context.Context, in Intent, resp Response, retention time.Duration) error {
	b := &pgx.Batch{}
	b.Queue(c.l.q.insertCompleted, c.l.completedArgs(in, resp, retention)...)
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	return c.l.sendAll(ctx, c.outer, b)
}

func (c *callerTx) commitFailure(ctx context.Context, in Intent, derr *DefinitiveError, retention time.Duration) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT oncekit_fn")
	b.Queue(c.l.q.insertFailed, c.l.failedArgs(in, derr, retention)...)
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	return c.l.sendAll(ctx, c.outer, b)
}

func (c *callerTx) abort(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK TO SAVEPOINT oncekit_claim")
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
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

func (l *Ledger) completedArgs(in Intent, resp Response, retention time.Duration) []any {
	return []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now(), string(in.Fingerprint),
		pgsql.Interval(retention), resp.Code, resp.Body, nullable(resp.ResourceRef)}
}

func (l *Ledger) failedArgs(in Intent, derr *DefinitiveError, retention time.Duration) []any {
	return []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now(), string(in.Fingerprint),
		pgsql.Interval(retention), derr.Code, derr.Message}
}

// waitMillis renders a wait for the claim function: 0 means do not wait at all.
func waitMillis(wait time.Duration) int64 {
	if wait <= 0 {
		return 0
	}
	return max(wait.Milliseconds(), 1)
}

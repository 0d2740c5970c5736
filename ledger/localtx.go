package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pipetx"
)

// localTx is the transaction a local-mode execution runs in: the ledger's own
// ([ownTx]) or the caller's ([callerTx]). Its protocol, per attempt:
//
//	begin:  nothing is sent; fn gets a pipeTx
//	fn:     its first statement travels behind [BEGIN,] the claim and a savepoint
//	commit: the record with the result, and COMMIT (or RELEASE), in one round trip
//
// The claim takes a transaction-scoped advisory lock on the key without waiting, and
// refuses when the lock is taken or a live record exists. The record itself is a plain
// INSERT at commit, so the primary key stays the last word: a record committed by a
// racer after the claim looked makes the commit fail with a unique violation, and the
// attempt is settled from that record instead.
type localTx interface {
	// q reads records: outside any transaction for ownTx, inside the caller's for callerTx.
	q() querier
	// begin prepares the claim of in for mode and returns the transaction fn runs in.
	begin(in Intent, mode claimMode) *pipetx.Tx
	// firstAttemptMode is how a first attempt (DoOpts.FirstAttempt) claims.
	firstAttemptMode() claimMode
	// end is the statement that makes the record and fn's writes final: COMMIT, or the
	// release of the caller's savepoint.
	end() string
	// txStatus is the connection's transaction status, as pgconn reports it.
	txStatus() byte
	// abort undoes the claim and fn's writes, and leaves the connection (or the
	// caller's transaction) usable.
	abort(ctx context.Context, p *pipetx.Tx) error
	// waitFor blocks until the attempt holding lock has finished, for at most d. It
	// returns an error with SQLSTATE 55P03 when d runs out.
	waitFor(ctx context.Context, lock int64, d time.Duration) error
	// deleteExpired removes the key's record if it has expired: an expired record is
	// absent, and the next attempt may record a new intent under the key.
	deleteExpired(ctx context.Context, in Intent) error
}

// lockKey is the advisory lock of a key: 64 bits of a SHA-256 over the schema and the
// key's identity, so ledgers in different schemas never contend.
func (l *Ledger) lockKey(in Intent) int64 {
	h := sha256.New()
	for _, s := range []string{"oncekit", l.cfg.Schema, in.Scope.Tenant, in.Scope.Operation, string(in.Key)} {
		h.Write([]byte(s))
		h.Write([]byte{0x1f})
	}
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// claimArgs are the parameters of a claim: the key's lock, then the key and the clock.
func (l *Ledger) claimArgs(in Intent) []any {
	return []any{l.lockKey(in), in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now()}
}

// ownTx is the ledger's own transaction on a pooled connection.
type ownTx struct {
	l           *Ledger
	conn        *pgx.Conn
	rollbackDue bool // a refused claim's healthy transaction, rolled back with the next read
}

// rollbackFirst is a connection whose next read first rolls back the transaction it is
// in, in the same round trip.
type rollbackFirst struct{ *pgx.Conn }

func (r rollbackFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	b := &pgx.Batch{}
	b.Queue("ROLLBACK")
	b.Queue(sql, args...)
	br := r.Conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return errRow{err}
	}
	return closingRow{row: br.QueryRow(), br: br}
}

// closingRow closes its batch once scanned.
type closingRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r closingRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// q reads records on the connection; after a refused claim the rollback of its
// transaction travels in the same round trip as the read.
func (o *ownTx) q() querier {
	if o.rollbackDue {
		o.rollbackDue = false
		return rollbackFirst{o.conn}
	}
	return o.conn
}

func (o *ownTx) begin(in Intent, mode claimMode) *pipetx.Tx {
	switch mode {
	case optimistic:
		return newPipeTx(o.conn, true, -1, false)
	case claimFirst:
		return newPipeTx(o.conn, true, 0, true, pipetx.Queued(o.l.q.claimCheck, o.l.claimArgs(in)...), pipetx.Queued("SAVEPOINT oncekit_fn"))
	}
	return newPipeTx(o.conn, true, 0, false,
		pipetx.Queued(o.l.q.claimLocal, o.l.claimArgs(in)...),
		pipetx.Queued("SAVEPOINT oncekit_fn"))
}

// errClaimRefused is what fn's statements return after the claim that travelled with
// the first of them was refused. fn's outcome is discarded then; the ledger settles the
// call from the key's record.
var errClaimRefused = errors.New("oncekit/ledger: the key is taken by another attempt: return this error")

// newPipeTx is the transaction fn runs in: the prefix travels with its first statement.
func newPipeTx(via pipetx.Sender, begin bool, claimAt int, checked bool, prefix ...*pgx.QueuedQuery) *pipetx.Tx {
	return pipetx.New(pipetx.Config{Via: via, Begin: begin, Prefix: prefix, ClaimAt: claimAt, Checked: checked,
		Refused: errClaimRefused, Managed: ErrManagedTx})
}

func (o *ownTx) firstAttemptMode() claimMode { return optimistic }
func (o *ownTx) end() string                 { return "COMMIT" }
func (o *ownTx) txStatus() byte              { return o.conn.PgConn().TxStatus() }

func (o *ownTx) abort(ctx context.Context, p *pipetx.Tx) error {
	if o.conn.PgConn().TxStatus() == 'I' {
		return nil
	}
	if p != nil && p.Refused() && p.Checked() && o.conn.PgConn().TxStatus() == 'T' {
		// The record decides next, so the rollback waits to travel with its lookup.
		o.rollbackDue = true
		return nil
	}
	// ROLLBACK without arguments travels with the simple protocol, which an aborted
	// transaction accepts.
	_, err := o.conn.Exec(ctx, "ROLLBACK")
	return err
}

func (o *ownTx) waitFor(ctx context.Context, lock int64, d time.Duration) error {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(setLockTimeout, lockTimeout(d))
	b.Queue(waitLock, lock)
	err := o.conn.SendBatch(ctx, b).Close()
	if rbErr := o.abort(context.WithoutCancel(ctx), nil); err == nil {
		err = rbErr
	}
	return err
}

func (o *ownTx) deleteExpired(ctx context.Context, in Intent) error {
	_, err := o.conn.Exec(ctx, o.l.q.deleteExpired, in.Scope.Tenant, in.Scope.Operation, string(in.Key), o.l.now())
	return err
}

// callerTx runs inside the caller's transaction, fenced by savepoints so that a failure
// undoes only what the ledger did.
type callerTx struct {
	l     *Ledger
	outer pgx.Tx
}

func (c *callerTx) q() querier { return c.outer }

// begin always claims: an optimistic attempt would find a concurrent one only at its
// INSERT, and wait there as long as that attempt's transaction, the caller's, lasts.
func (c *callerTx) begin(in Intent, mode claimMode) *pipetx.Tx {
	claim := c.l.q.claimLocal
	if mode == claimFirst {
		claim = c.l.q.claimCheck
	}
	return newPipeTx(c.outer, false, 1, mode == claimFirst,
		pipetx.Queued("SAVEPOINT oncekit_claim"),
		pipetx.Queued(claim, c.l.claimArgs(in)...),
		pipetx.Queued("SAVEPOINT oncekit_fn"))
}

func (c *callerTx) firstAttemptMode() claimMode { return claimWithFirstStatement }
func (c *callerTx) end() string                 { return "RELEASE SAVEPOINT oncekit_claim" }
func (c *callerTx) txStatus() byte              { return c.outer.Conn().PgConn().TxStatus() }

// abort rolls back to where DoTx began. Both statements travel as one simple-protocol
// query, which an aborted transaction accepts: an extended-protocol batch would have
// its RELEASE prepared first, and refused.
func (c *callerTx) abort(ctx context.Context, p *pipetx.Tx) error {
	if p != nil && !p.Sent() {
		return nil
	}
	_, err := c.outer.Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_claim; RELEASE SAVEPOINT oncekit_claim")
	return err
}

func (c *callerTx) waitFor(ctx context.Context, lock int64, d time.Duration) error {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_wait")
	b.Queue(setLockTimeout, lockTimeout(d))
	b.Queue(waitLock, lock)
	err := c.outer.SendBatch(ctx, b).Close()
	// Rolling back to the savepoint releases the lock and restores lock_timeout.
	_, rbErr := c.outer.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT oncekit_wait; RELEASE SAVEPOINT oncekit_wait")
	if err == nil {
		err = rbErr
	}
	return err
}

func (c *callerTx) deleteExpired(ctx context.Context, in Intent) error {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_claim")
	b.Queue(c.l.q.deleteExpired, in.Scope.Tenant, in.Scope.Operation, string(in.Key), c.l.now())
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	err := c.outer.SendBatch(ctx, b).Close()
	if err != nil && c.outer.Conn().PgConn().TxStatus() == 'E' {
		if rbErr := c.abort(context.WithoutCancel(ctx), nil); rbErr != nil {
			return errors.Join(err, rbErr)
		}
	}
	return err
}

// commitFailure undoes fn's writes, stores the failure and makes it final. It works
// whatever state fn left the transaction in, aborted included.
func commitFailure(ctx context.Context, lt localTx, p *pipetx.Tx, record *pgx.Batch) error {
	if err := undoFn(ctx, p); err != nil {
		return err
	}
	return finish(ctx, lt, p, record)
}

// finish sends record (the record's INSERT and the statement that ends the transaction,
// commit or release) in one round trip. In the ledger's own transaction the pgx.Tx
// handed to fn is done with after it; it is not committed through pgx because that would
// cost a round trip of its own.
func finish(ctx context.Context, lt localTx, p *pipetx.Tx, record *pgx.Batch) error {
	if p.Sent() && p.Err() == nil && lt.txStatus() != 'T' {
		return ErrTxAborted
	}
	br, err := p.Send(ctx, record)
	if err != nil {
		return err
	}
	return br.Close()
}

// recordBatch is a record's INSERT followed by end, for [finish].
func recordBatch(insert string, args []any, end string) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(insert, args...)
	b.Queue(end)
	return b
}

// undoFn rolls fn's writes back to the savepoint behind the claim. When fn left the
// transaction aborted the rollback goes alone, with the simple protocol: in an aborted
// transaction PostgreSQL refuses to prepare or describe the statements that follow it,
// which pgx does first for a batch in most of its exec modes.
func undoFn(ctx context.Context, p *pipetx.Tx) error {
	if !p.Sent() || p.Err() != nil {
		return nil
	}
	_, err := p.Current().Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_fn")
	return err
}

const (
	setLockTimeout = "SELECT set_config('lock_timeout', $1, true)"
	waitLock       = "SELECT pg_advisory_xact_lock($1)"
	// maxLockTimeout is the longest lock_timeout PostgreSQL accepts (2^31-1 ms).
	maxLockTimeout = time.Duration(1<<31-1) * time.Millisecond
)

// lockTimeout renders a wait for lock_timeout, clamped to what PostgreSQL accepts; 0
// would mean "no limit" there, so the shortest wait is 1ms.
func lockTimeout(d time.Duration) string {
	return strconv.FormatInt(min(max(d, time.Millisecond), maxLockTimeout).Milliseconds(), 10) + "ms"
}

// completedBatch is the batch of a completed record with everything but the response
// and the record's time, which [setCompleted] fills in through args.
func (l *Ledger) completedBatch(in Intent, retention time.Duration, end string) (b *pgx.Batch, args []any) {
	args = []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now(), string(in.Fingerprint),
		pgsql.Interval(retention), nil, nil, nil, nil}
	return recordBatch(l.q.insertCompleted, args, end), args
}

// setCompleted fills in the parameters $7 to $10 of insert_completed.
func setCompleted(args []any, resp Response, at time.Time) {
	args[6], args[7], args[8], args[9] = resp.Code, resp.Body, nullable(resp.ResourceRef), at
}

func (l *Ledger) failedArgs(in Intent, derr *DefinitiveError, retention time.Duration, at time.Time) []any {
	return []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now(), string(in.Fingerprint),
		pgsql.Interval(retention), storableText(derr.Code), storableText(derr.Message), at}
}

// storableText makes s storable as PostgreSQL text: invalid UTF-8 and NUL bytes become
// U+FFFD. A definitive failure is the intent's outcome, so its text is repaired rather
// than the failure lost.
func storableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// checkText returns the offset of the first byte of s that PostgreSQL text cannot hold
// (NUL or invalid UTF-8), or -1.
func checkText(s string) int {
	if i := strings.IndexByte(s, 0); i >= 0 {
		return i
	}
	if utf8.ValidString(s) {
		return -1
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return i
			}
		}
	}
	return -1
}

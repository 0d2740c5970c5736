package ledger

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pipetx"
)

// localTx is the transaction a call of Do or DoTx runs in: the ledger's own
// ([ownTx]) or the caller's ([callerTx]). Its protocol, per attempt:
//
//	begin:  nothing is sent; fn gets a pipeTx
//	fn:     its first statement travels behind [BEGIN,] the claim and a savepoint
//	commit: the record with the result, and COMMIT (or RELEASE), in one round trip
//
// The claim takes a transaction-scoped advisory lock on the key without waiting, and
// refuses when the lock is taken or a live record exists. The record itself is
// inserted at commit, replacing an expired record of the key, so the primary key stays
// the last word: a live record committed by an attempt that took no claim makes the
// commit fail, and the call is settled from that record instead. A refused claim waits
// for the attempt holding the key by queueing for the key's lock, and keeps the lock
// when it gets it, so that of many waiters one takes the key and the others replay.
type localTx interface {
	// q reads records: outside any transaction for ownTx, inside the caller's for callerTx.
	q() querier
	// mode is how a call with DoOpts.Mode m claims here.
	mode(m Mode) Mode
	// begin prepares the claim of in for mode, by the clock now, and returns the
	// transaction fn runs in.
	begin(in Intent, mode Mode, now *time.Time, onRefused func(context.Context) (*pipetx.Resume, error)) *pipetx.Tx
	// end is the statement that makes the record and fn's writes final: COMMIT, or the
	// release of the caller's savepoint.
	end() string
	// txStatus is the connection's transaction status, as pgconn reports it.
	txStatus() byte
	// abort undoes the claim and fn's writes, and leaves the connection (or the
	// caller's transaction) usable.
	abort(ctx context.Context, p *pipetx.Tx) error
	// hold waits, for at most d, until the attempt holding the key's lock has finished,
	// and takes the lock in an open transaction (or savepoint), from which the claim of
	// mode is sent again. It returns an error with SQLSTATE 55P03 when d runs out, with
	// nothing left open.
	hold(ctx context.Context, in Intent, mode Mode, now *time.Time, d time.Duration) (*pipetx.Resume, error)
}

// lockKey is the advisory lock of a key: 64 bits of a SHA-256 over the schema and the
// key's identity, so ledgers in different schemas never contend.
func (l *Ledger) lockKey(in Intent) int64 {
	return pgsql.LockKey("oncekit", l.cfg.Schema, in.Scope.Tenant, in.Scope.Operation, string(in.Key))
}

// claimArgs are the parameters of a claim: the key's lock, then the key and the clock
// (nil: the database's).
func (l *Ledger) claimArgs(in Intent, now *time.Time) []any {
	return []any{l.lockKey(in), in.Scope.Tenant, in.Scope.Operation, string(in.Key), now}
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

func (o *ownTx) mode(m Mode) Mode { return m }

// claim is the claim of mode, behind the statement that tries the key's lock (at
// index 1): one that answers before fn runs (claimCheck), or one that refuses by failing
// so that PostgreSQL skips what travels behind it.
func (o *ownTx) claim(in Intent, mode Mode, now *time.Time) []*pgx.QueuedQuery {
	args := o.l.claimArgs(in, now)
	claim := o.l.q.claimLocal
	if mode == ModeClaimFirst || mode == ModeLookUpFirst {
		claim = o.l.q.claimCheck
	}
	return []*pgx.QueuedQuery{pipetx.Queued(o.l.q.claimLock, args[:4]...), pipetx.Queued(claim, args...)}
}

func (o *ownTx) begin(in Intent, mode Mode, now *time.Time, onRefused func(context.Context) (*pipetx.Resume, error)) *pipetx.Tx {
	cfg := pipetx.Config{Via: o.conn, Begin: true, ClaimAt: -1, Refused: errClaimRefused, Managed: ErrManagedTx, OnRefused: onRefused}
	if mode != ModeOptimistic {
		cfg.ClaimAt, cfg.Checked = 1, mode == ModeClaimFirst || mode == ModeLookUpFirst
		cfg.Prefix = append(o.claim(in, mode, now), pipetx.Queued(savepointFn))
	}
	if mode == ModeClaimWithFirstStatement {
		// A refused claim fails its batch: pgx would forget the batch's cached
		// statements, then deallocate and prepare them again on the next call (two round
		// trips). Statements prepared by name stay, and the rollback and the read of the
		// record that answers the call, prepared with them, travel together after the
		// refusal although the transaction is aborted: a replay takes two round trips.
		cfg.Named, cfg.AlsoNamed = true, []string{"ROLLBACK", o.l.q.lookup}
	}
	return pipetx.New(cfg)
}

// errClaimRefused is what fn's statements return once the call was decided by the key's
// record: another attempt completed the key, or holds it past the wait. fn's outcome
// is discarded then.
var errClaimRefused = errors.New("oncekit/ledger: the key is taken by another attempt, whose record answers this call: return this error")

func (o *ownTx) end() string    { return "COMMIT" }
func (o *ownTx) txStatus() byte { return o.conn.PgConn().TxStatus() }

func (o *ownTx) abort(ctx context.Context, p *pipetx.Tx) error {
	if o.conn.PgConn().TxStatus() == 'I' {
		return nil
	}
	ctx, cancel := pgsql.Cleanup(ctx)
	defer cancel()
	if p != nil && p.Refused() && o.rollbackTravels(p) {
		// The record decides next, so the rollback waits to travel with its lookup.
		o.rollbackDue = true
		return nil
	}
	// ROLLBACK without arguments travels with the simple protocol, which an aborted
	// transaction accepts.
	_, err := o.conn.Exec(ctx, "ROLLBACK")
	return err
}

// rollbackTravels reports whether the rollback of p's refused claim may travel in one
// batch with the read that follows it: in a healthy transaction (a claim that answered
// false), or in an aborted one when both went on statements prepared by name, which
// PostgreSQL runs there without parsing them.
func (o *ownTx) rollbackTravels(p *pipetx.Tx) bool {
	switch o.conn.PgConn().TxStatus() {
	case 'T':
		return p.Checked()
	case 'E':
		return p.Named()
	}
	return false
}

func (o *ownTx) hold(ctx context.Context, in Intent, mode Mode, now *time.Time, d time.Duration) (*pipetx.Resume, error) {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	tx, err := o.l.holdLock(ctx, o.conn, b, in, d)
	if err != nil {
		if aerr := o.abort(context.WithoutCancel(ctx), nil); aerr != nil {
			return nil, errors.Join(err, aerr)
		}
		return nil, err
	}
	return &pipetx.Resume{Tx: tx, ClaimAt: 1, Prefix: append(o.claim(in, mode, now), pipetx.Queued(savepointFn))}, nil
}

// holdLock sends b, which opens a transaction or a savepoint, with the statement that
// waits for the key's lock for at most d and keeps it (wait_lock), and returns the
// transaction that holds the lock, if b began one. The wait is bounded on the server by
// lock_timeout (d is never past the context's deadline), so a deadline ends it with an
// error PostgreSQL answers, not with the connection closed under it; a context
// cancelled without a deadline still interrupts it as pgx interrupts any statement.
func (l *Ledger) holdLock(ctx context.Context, via pipetx.Sender, b *pgx.Batch, in Intent, d time.Duration) (pgx.Tx, error) {
	b.Queue(l.q.waitLock, l.lockKey(in), lockTimeout(d), in.Scope.Tenant, in.Scope.Operation, string(in.Key))
	wctx := context.WithoutCancel(ctx)
	wctx, cancel := context.WithTimeout(wctx, d+holdGrace)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stop()
	br := via.SendBatch(wctx, b)
	_, err := br.Exec() // BEGIN or SAVEPOINT
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return br.Tx(), err
}

// holdGrace is how long past its lock_timeout a wait for a key's lock may go unanswered
// before the connection is given up: a server that does not answer.
const holdGrace = 10 * time.Second

// callerTx runs inside the caller's transaction, fenced by savepoints so that a failure
// undoes only what the ledger did.
type callerTx struct {
	l     *Ledger
	outer pgx.Tx
}

func (c *callerTx) q() querier { return c.outer }

// mode: every mode claims with fn's first statement, or before fn; an optimistic
// attempt would find a concurrent one only at its INSERT, and wait there as long as
// that attempt's transaction, the caller's, lasts.
func (c *callerTx) mode(m Mode) Mode {
	if m == ModeOptimistic {
		return ModeClaimWithFirstStatement
	}
	return m
}

// claim is the claim of a caller's transaction, in every mode: the claim that refuses
// by failing, so that the probe for records the caller's snapshot cannot see does not
// run for a taken key.
func (c *callerTx) claim(in Intent, now *time.Time) []*pgx.QueuedQuery {
	args := c.l.claimArgs(in, now)
	return []*pgx.QueuedQuery{
		pipetx.Queued(c.l.q.claimLock, args[:4]...),
		pipetx.Queued(c.l.q.claimLocal, args...),
		pipetx.Queued(c.l.q.claimProbe, in.Scope.Tenant, in.Scope.Operation, string(in.Key), now),
		pipetx.Queued(savepointFn),
	}
}

func (c *callerTx) begin(in Intent, mode Mode, now *time.Time, onRefused func(context.Context) (*pipetx.Resume, error)) *pipetx.Tx {
	return pipetx.New(pipetx.Config{Via: c.outer, ClaimAt: 2, Refused: errClaimRefused, Managed: ErrManagedTx,
		OnRefused: onRefused, Guard: true,
		Prefix: append([]*pgx.QueuedQuery{pipetx.Queued("SAVEPOINT oncekit_claim")}, c.claim(in, now)...)})
}

func (c *callerTx) end() string    { return "RELEASE SAVEPOINT oncekit_claim" }
func (c *callerTx) txStatus() byte { return c.outer.Conn().PgConn().TxStatus() }

// abort rolls back to where DoTx began. Both statements travel as one simple-protocol
// query, which an aborted transaction accepts: an extended-protocol batch would have
// its RELEASE prepared first, and refused.
func (c *callerTx) abort(ctx context.Context, p *pipetx.Tx) error {
	if p != nil && !p.Opened() {
		return nil
	}
	ctx, cancel := pgsql.Cleanup(ctx)
	defer cancel()
	_, err := c.outer.Exec(ctx, "ROLLBACK TO SAVEPOINT oncekit_claim; RELEASE SAVEPOINT oncekit_claim")
	return err
}

func (c *callerTx) hold(ctx context.Context, in Intent, _ Mode, now *time.Time, d time.Duration) (*pipetx.Resume, error) {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_claim")
	_, err := c.l.holdLock(ctx, c.outer, b, in, d)
	if err != nil {
		// Rolling back to the savepoint releases the lock and restores lock_timeout.
		if !c.outer.Conn().IsClosed() {
			if aerr := c.abort(context.WithoutCancel(ctx), nil); aerr != nil {
				return nil, errors.Join(err, aerr)
			}
		}
		return nil, err
	}
	return &pipetx.Resume{ClaimAt: 1, Prefix: c.claim(in, now)}, nil
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
	savepointFn = "SAVEPOINT oncekit_fn"
	// maxLockTimeout is the longest lock_timeout PostgreSQL accepts (2^31-1 ms).
	maxLockTimeout = time.Duration(1<<31-1) * time.Millisecond
)

// lockTimeout renders a wait for lock_timeout, clamped to what PostgreSQL accepts; 0
// would mean "no limit" there, so the shortest wait is 1ms.
func lockTimeout(d time.Duration) string {
	return strconv.FormatInt(min(max(d, time.Millisecond), maxLockTimeout).Milliseconds(), 10) + "ms"
}

// completedBatch is the batch of a completed record with everything but the clock, the
// response and the record's time, which [Ledger.setCompleted] fills in through args;
// origin is the record's [Origin] ($11 to $14).
func (l *Ledger) completedBatch(in Intent, retention time.Duration, origin [4]any, end string) (b *pgx.Batch, args []any) {
	args = []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), nil, string(in.Fingerprint),
		pgsql.Interval(retention), nil, nil, nil, nil, origin[0], origin[1], origin[2], origin[3]}
	return recordBatch(l.q.insertCompleted, args, end), args
}

// setCompleted fills in the clock ($4), the claim's, so that the record replaces what
// the claim found expired and nothing it found live; and the parameters $7 to $10 of
// insert_completed.
func setCompleted(args []any, resp Response, at time.Time, now *time.Time) {
	args[3] = now
	args[6], args[7], args[8], args[9] = resp.Code, resp.Body, nullable(resp.ResourceRef), at
}

func (l *Ledger) failedArgs(in Intent, derr *DefinitiveError, retention time.Duration, at time.Time, now *time.Time, origin [4]any) []any {
	code, body := failureResponse(derr)
	return []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), now, string(in.Fingerprint),
		pgsql.Interval(retention), storableText(derr.Code), storableText(derr.Message), at, code, body,
		origin[0], origin[1], origin[2], origin[3]}
}

// failureResponse is the status and body a definitive failure stores: its Response's,
// or 0 and none.
func failureResponse(derr *DefinitiveError) (int, []byte) {
	if derr.Response == nil {
		return 0, nil
	}
	return derr.Response.Code, derr.Response.Body
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

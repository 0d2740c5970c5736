package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pipetx"
)

// Statement is one SQL statement that makes a mutation: an INSERT, UPDATE or DELETE
// with RETURNING, or a WITH query (of them, whose main statement may be a SELECT of
// what they return; one that only reads is run and stored all the same), and its
// arguments. The rows it returns are the response [Ledger.DoStatement] stores and
// replays.
type Statement struct {
	// SQL is the statement, with $1, $2, ... for Args. Names that begin with oncekit_
	// are the ledger's: the statement must not define a WITH query by such a name.
	SQL string
	// Args are the statement's arguments, as pgx takes them; pgx.NamedArgs as the only
	// argument rewrites @names to positions first.
	Args []any
	// Code is the status code stored with the rows, Response.Code of the result.
	// Defaults to 0.
	Code int
}

// StatementOpts are per-call options of [Ledger.DoStatement]. A nil *StatementOpts
// means all defaults.
type StatementOpts struct {
	// Wait bounds how long the call waits for a concurrent attempt with the same key,
	// as [DoOpts].Wait does. Defaults to 0: fail fast, as [NoWait] does.
	Wait time.Duration
	// Retention overrides how long this record is kept. Defaults to the operation's
	// retention from [Config]; a negative value is refused with an error before any SQL.
	Retention time.Duration
}

// DoStatement runs st under the key, once per intent, in one statement and one round
// trip: the claim, st and the record with st's rows travel as one SQL statement that
// commits by itself (no BEGIN, no COMMIT), with a read of the key's record ahead of it
// in the same round trip. The response is st's returned rows as a JSON array of objects,
// each as PostgreSQL's row_to_json renders a row ([] when st returned none), with
// Response.Code set to st.Code; a replay returns the same bytes.
//
// A retry of a completed intent returns the stored response with Result.Replayed set,
// in one round trip that writes nothing; st does not run. A key whose record expired
// and was not purged yet is a new intent, in two round trips: the first learns of the
// expired record, the second replaces it. The same key with another
// fingerprint returns a [*FingerprintMismatchError]; a key another attempt holds is
// waited for up to [StatementOpts].Wait as [Ledger.Do] waits, and then replays or runs
// st once (a claim of [Ledger.Claim] whose lease ran out is not taken over: that is an
// [*InProgressError] at once); a stored failure from [Ledger.Do] is returned as its
// [*DefinitiveError]. A lost answer to the round trip that carries st (a FATAL, a
// broken connection, a context that ended once it was sent) is an
// [*OutcomeUnknownError], settled by a retry with the same key. Any other error means
// st's writes were rolled back and the key is free: a failing st stores nothing, so a
// statement that may fail for good belongs in Do with a [*DefinitiveError].
//
// st runs only once the key is claimed, and commits with the record or not at all. The
// claim takes the key's lock in the look-up ahead of st, before st's snapshot is taken,
// so st never starts for a key that another call taking the lock (Do in every mode but
// [ModeOptimistic], DoTx, DoStatement) holds or has completed. [Ledger.Claim] and
// ModeOptimistic take no lock: a record of theirs committed while st runs meets the
// record's primary key, and st's writes roll back, but what st did that does not roll
// back stays. It
// may not be more than one statement, control the transaction, or lack RETURNING (each
// refused before anything is sent), nor define a WITH query named oncekit_... . What
// cannot be checked is the caller's to keep: functions the statement calls run inside
// the claimed statement, so effects outside the database (dblink, COPY TO PROGRAM,
// notifications to other systems), or that do not roll back (sequences, session
// advisory locks), happen only for a claimed key but stay if the statement then rolls
// back; a function declared IMMUTABLE or STABLE may be evaluated while the statement is
// planned, before the claim, so it must not write anything (an expression PostgreSQL
// folds to a constant is evaluated then too, and its error fails the call before the
// claim, storing nothing); and the statement must not write the ledger's own table. A body over [Config].MaxBodyBytes rolls everything back
// with a [*BodyTooLargeError].
//
// Each connection prepares the statement once, by name, whatever its
// pgx.QueryExecMode (one round trip the first time), and keeps at most 128 statements
// prepared this way: a connection behind a pooler that cannot keep prepared statements
// (PgBouncer in transaction mode before 1.21) cannot run DoStatement. DoStatement has no
// form inside a caller's transaction: a statement of its own is what lets it commit in
// the round trip that runs it. Use [Ledger.DoTx] there. It does not run on Citus,
// which refuses the subqueries of its INSERT.
func (l *Ledger) DoStatement(ctx context.Context, in Intent, st Statement, opts *StatementOpts) (res Result, err error) {
	ctx, c := l.tel.begin(ctx, "DoStatement", in.Scope)
	defer l.endCall(c, in.Scope.Tenant, l.r.Name, &res, &err)
	o := StatementOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Wait < 0 {
		o.Wait = 0
	}
	if err := l.validate(in.Scope, in.Key, in.Fingerprint); err != nil {
		return Result{}, err
	}
	if o.Retention < 0 {
		return Result{}, errors.New("oncekit/ledger: StatementOpts.Retention must not be negative")
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	conn, err := l.acquire(ctx, in.Scope.Tenant)
	if err != nil {
		return Result{}, err
	}
	defer conn.Release()
	sql, args := st.SQL, st.Args
	if len(args) > 0 {
		if r, ok := args[0].(pgx.QueryRewriter); ok {
			if sql, args, err = r.RewriteQuery(ctx, conn.Conn(), sql, args[1:]); err != nil {
				return Result{}, fmt.Errorf("oncekit/ledger: rewrite the statement: %w", err)
			}
		}
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return Result{}, errors.New("oncekit/ledger: DoStatement takes no query options among its arguments: the ledger sends the statement")
		}
	}
	forms, err := l.guarded(sql, len(args))
	if err != nil {
		return Result{}, err
	}
	s := &stmtAttempt{l: l, in: in, conn: conn.Conn(), forms: forms, w: newWait(ctx, o.Wait), code: st.Code,
		retention: l.retention(in.Scope.Operation, o.Retention), base: len(args)}
	origin := originArgs(ctx)
	s.args = append(append(make([]any, 0, len(args)+14), args...),
		in.Scope.Tenant, in.Scope.Operation, string(in.Key), string(in.Fingerprint), int32(st.Code), l.lockKey(in),
		nil, int32(l.cfg.MaxBodyBytes), nil, pgsql.Interval(s.retention), origin[0], origin[1], origin[2], origin[3])
	return s.run(ctx)
}

// guardedCache holds the guarded forms of the statements seen, by statement and
// argument count; past guardedLimit it starts over.
var (
	guardedMu    sync.Mutex
	guardedCache = map[guardedKey]guardedForms{}
)

// guardedForms are a statement's two guarded forms (see sql/statement.sql): first
// refuses any record of the key and inserts the record without a conflict clause;
// replace refuses only a live record and replaces an expired one.
type guardedForms struct{ first, replace string }

type guardedKey struct {
	schema, sql string
	n           int
}

const guardedLimit = 1024

// guarded returns the statement sql, with n arguments, in its guarded forms (see
// sql/statement.sql), or why it cannot run guarded.
func (l *Ledger) guarded(sql string, n int) (guardedForms, error) {
	k := guardedKey{l.cfg.Schema, sql, n}
	guardedMu.Lock()
	forms, ok := guardedCache[k]
	guardedMu.Unlock()
	if ok {
		return forms, nil
	}
	p, err := splitStatement(sql)
	if err != nil {
		return guardedForms{}, fmt.Errorf("oncekit/ledger: DoStatement: %w", err)
	}
	if p.maxParam > n {
		return guardedForms{}, fmt.Errorf("oncekit/ledger: DoStatement: the statement uses $%d and has %d arguments", p.maxParam, n)
	}
	with := "WITH"
	if p.recursive {
		with += " RECURSIVE"
	}
	if p.ctes != "" {
		with += " " + p.ctes + "\n," // a -- comment at its end must not swallow the comma
	}
	param := func(i int, typ string) string { return "$" + strconv.Itoa(n+i) + "::" + typ }
	r := strings.NewReplacer(
		"{{with}}", with, "{{main}}", p.main+"\n",
		"{{tenant}}", param(1, "text"), "{{operation}}", param(2, "text"), "{{key}}", param(3, "text"),
		"{{fingerprint}}", param(4, "text"), "{{code}}", param(5, "int4"), "{{lock}}", param(6, "int8"),
		"{{now}}", param(7, "timestamptz"), "{{max}}", param(8, "int4"), "{{at}}", param(9, "timestamptz"),
		"{{retention}}", param(10, "interval"), "{{workflow_id}}", param(11, "text"), "{{run_id}}", param(12, "text"),
		"{{workflow_type}}", param(13, "text"), "{{activity_type}}", param(14, "text"),
	)
	forms = guardedForms{first: r.Replace(l.q.statementFirst), replace: r.Replace(l.q.statementReplace)}
	guardedMu.Lock()
	if len(guardedCache) >= guardedLimit {
		clear(guardedCache)
	}
	guardedCache[k] = forms
	guardedMu.Unlock()
	return forms, nil
}

// stmtAttempt is one call of DoStatement.
type stmtAttempt struct {
	l     *Ledger
	in    Intent
	conn  *pgx.Conn
	forms guardedForms
	// replacing says the look-up showed the key's record expired: the statement is
	// sent in the form that replaces it.
	replacing bool
	args      []any
	w         wait
	code      int
	retention time.Duration
	// base is how many arguments the caller's statement has: the ledger's follow them.
	base int
}

// The guarded statement refuses a taken key, and a body over the limit, by failing a
// cast to integer of a text that starts with one of these, followed by a number.
const (
	claimRefused = "oncekit_claim_refused="
	bodyTooLarge = "oncekit_body_bytes="
)

// marked returns the number after marker in err's message, if err is the guarded
// statement's failed cast of a text that starts with marker; "" otherwise.
func marked(err error, marker string) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	_, n, ok := strings.Cut(pgErr.Message, `"`+marker)
	if !ok {
		return ""
	}
	n, _, _ = strings.Cut(n, `"`)
	return n
}

// run sends the record's lookup and the guarded statement in one round trip, and
// decides the call by what comes back.
func (s *stmtAttempt) run(ctx context.Context) (Result, error) {
	inTx := false
	for {
		now := s.l.now()
		at := s.l.recordedAt()
		// The ledger's parameters 7 (now) and 9 (the record's time).
		if now != nil {
			s.args[s.base+6] = *now
		} else {
			s.args[s.base+6] = nil
		}
		s.args[s.base+8] = at
		rec, body, err := s.send(ctx, now, inTx)
		if err == nil {
			return Result{Response: Response{Code: s.code, Body: body}, Attempts: 1, CreatedAt: at}, nil
		}
		cleanup, cancel := pgsql.Cleanup(ctx)
		defer cancel()
		var unsent unsentError
		if errors.As(err, &unsent) {
			// Nothing of this round was sent: not an unknown outcome.
			if inTx && !s.conn.IsClosed() {
				if _, rerr := s.conn.Exec(cleanup, "ROLLBACK"); rerr != nil {
					return Result{}, errors.Join(unsent.error, rerr)
				}
			}
			return Result{}, unsent.error
		}
		if inTx && s.conn.PgConn().TxStatus() != 'I' && !s.conn.IsClosed() {
			if _, rerr := s.conn.Exec(cleanup, "ROLLBACK"); rerr != nil {
				return Result{}, errors.Join(err, rerr)
			}
		}
		inTx = false // a next send, after a wait, opens a transaction of its own
		switch code := pgsql.Code(err); {
		case code == pgsql.InvalidTextRepresentation && marked(err, claimRefused) != "":
			// Refused: the record read just before answers, or another attempt holds
			// the key's lock.
		case statementConflict(err):
			// A live record written by an attempt that takes no claim met this one.
			res, free, err := s.l.settleQ(ctx, s.conn, s.in, s.waitLeft(), time.Now(), true)
			if free == notFree {
				return res, err
			}
			return Result{}, &InProgressError{Scope: s.in.Scope, Key: s.in.Key, Waited: time.Since(s.w.start)}
		case code == pgsql.InvalidTextRepresentation && marked(err, bodyTooLarge) != "":
			size, _ := strconv.Atoi(marked(err, bodyTooLarge))
			return Result{}, &BodyTooLargeError{Size: size, Limit: s.l.cfg.MaxBodyBytes}
		case code != "" && !pgsql.CommitUnknown(err):
			return Result{}, fmt.Errorf("oncekit/ledger: run the statement of %s in %s: %w", quoteKey(s.in.Key), s.in.Scope, err)
		default:
			// Sent: pgx may call an error safe to retry ("conn closed") for a statement
			// whose answer was lost after it committed, so none is taken for unsent.
			return Result{}, &OutcomeUnknownError{Scope: s.in.Scope, Key: s.in.Key, Err: err}
		}
		if rec != nil && rec.Expired && !s.replacing {
			// The first form refuses an expired record too: send the form that
			// replaces it, at once.
			s.replacing = true
			continue
		}
		if rec != nil && !rec.Expired {
			res, free, err := s.l.judge(s.in, rec)
			switch free {
			case notFree:
				return res, err
			case freeLeaseExpired:
				return Result{}, &InProgressError{Scope: s.in.Scope, Key: s.in.Key, Waited: time.Since(s.w.start)}
			}
			// Pending under a live lease: wait for it as Do does.
			res, free, err = s.l.settleQ(ctx, s.conn, s.in, s.waitLeft(), time.Now(), false)
			switch free {
			case notFree:
				return res, err
			case freeLeaseExpired:
				return Result{}, &InProgressError{Scope: s.in.Scope, Key: s.in.Key, Waited: time.Since(s.w.start)}
			}
			continue
		}
		// No live record: an attempt in flight holds the key's lock. Queue for the lock
		// in a transaction and send the statement again in it, holding the lock.
		d, byCtx := s.w.left()
		if d <= 0 {
			return Result{}, (&attempt{in: s.in, w: s.w}).gaveUp(byCtx)
		}
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		if _, err := s.l.holdLock(ctx, s.conn, b, s.in, d); err != nil {
			if s.conn.PgConn().TxStatus() != 'I' && !s.conn.IsClosed() {
				if _, rerr := s.conn.Exec(cleanup, "ROLLBACK"); rerr != nil {
					return Result{}, errors.Join(err, rerr)
				}
			}
			if pgsql.Code(err) == pgsql.LockNotAvailable {
				return Result{}, (&attempt{in: s.in, w: s.w}).gaveUp(byCtx)
			}
			return Result{}, fmt.Errorf("oncekit/ledger: wait for %s in %s: %w", quoteKey(s.in.Key), s.in.Scope, err)
		}
		if err := ctx.Err(); err != nil {
			if _, rerr := s.conn.Exec(cleanup, "ROLLBACK"); rerr != nil {
				return Result{}, errors.Join(err, rerr)
			}
			return Result{}, err
		}
		inTx = true
	}
}

// statementConflict reports whether err is the record's insert meeting a record of
// the key that appeared after the statement's look: the records table's primary key
// (the first form) or its state check (the replacing form), not a constraint of the
// caller's tables.
func statementConflict(err error) bool {
	if pgsql.IsUniqueViolation(err, "idempotency_records_pkey") {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgsql.CheckViolation &&
		strings.HasPrefix(pgErr.ConstraintName, "idempotency_records_state_check")
}

// waitLeft is how much of the call's wait is left, for settleQ, which counts from now.
func (s *stmtAttempt) waitLeft() time.Duration {
	d, _ := s.w.left()
	return max(d, 0)
}

// send sends the lookup of the key's record and the guarded statement (and COMMIT,
// inTx) in one round trip, on statements prepared on the connection by name rather than
// through pgx's statement cache: pgx forgets, and then deallocates and prepares again,
// every cached statement of a batch that failed, and a refused claim fails its batch.
// It returns the record read (nil for none) and the stored body.
func (s *stmtAttempt) send(ctx context.Context, now *time.Time, inTx bool) (*Record, []byte, error) {
	lsd, err := pipetx.PrepareNamed(ctx, s.conn, s.l.q.statementLookup)
	if err != nil {
		return nil, nil, unsentError{err}
	}
	text := s.forms.first
	if s.replacing {
		text = s.forms.replace
	}
	ssd, err := pipetx.PrepareNamed(ctx, s.conn, text)
	if err != nil {
		return nil, nil, unsentError{fmt.Errorf("oncekit/ledger: prepare the statement: %w", err)}
	}
	tm := s.conn.TypeMap()
	var le, se pgx.ExtendedQueryBuilder
	if err := le.Build(tm, lsd, []any{s.in.Scope.Tenant, s.in.Scope.Operation, string(s.in.Key), now, s.args[s.base+5]}); err != nil {
		return nil, nil, unsentError{err}
	}
	if err := se.Build(tm, ssd, s.args); err != nil {
		return nil, nil, unsentError{fmt.Errorf("oncekit/ledger: encode the statement's arguments: %w", err)}
	}
	b := &pgconn.Batch{}
	b.ExecStatement(lsd, le.ParamValues, le.ParamFormats, le.ResultFormats)
	b.ExecStatement(ssd, se.ParamValues, se.ParamFormats, se.ResultFormats)
	if inTx {
		b.ExecParams("COMMIT", nil, nil, nil, nil)
	}
	mrr := s.conn.PgConn().ExecBatch(ctx, b)
	var rec *Record
	var body []byte
	var rerr error
	if mrr.NextResult() {
		rows := pgx.RowsFromResultReader(tm, mrr.ResultReader())
		if rows.Next() {
			r := &Record{Scope: s.in.Scope, Key: s.in.Key}
			var sc recordScan
			if rerr = rows.Scan(sc.dest(r)...); rerr == nil {
				sc.finish(r)
				rec = r
			}
		}
		rows.Close()
		if rerr == nil {
			rerr = rows.Err()
		}
	}
	if rerr == nil && mrr.NextResult() {
		rows := pgx.RowsFromResultReader(tm, mrr.ResultReader())
		if rows.Next() {
			rerr = rows.Scan(&body)
		}
		rows.Close()
		if rerr == nil {
			rerr = rows.Err()
		}
	}
	if err := mrr.Close(); err != nil {
		return rec, nil, err
	}
	if rerr != nil {
		return rec, nil, rerr
	}
	if body == nil {
		return rec, nil, errors.New("oncekit/ledger: the statement returned no record")
	}
	return rec, body, nil
}

// unsentError is an error from before the guarded statement was sent.
type unsentError struct{ error }

func (e unsentError) Unwrap() error { return e.error }

// judge decides a call by a live record of its key: a replay, a stored failure or a
// mismatch; or the key is free of it (a lease that ran out); or the record is pending
// under a live lease (freeAbsent here, for the caller to wait on).
func (l *Ledger) judge(in Intent, rec *Record) (Result, freedom, error) {
	if rec.Fingerprint != in.Fingerprint {
		return Result{}, notFree, &FingerprintMismatchError{Scope: in.Scope, Key: in.Key, StoredFingerprint: rec.Fingerprint,
			Fingerprint: in.Fingerprint, StoredState: rec.State, StoredAt: rec.CreatedAt}
	}
	switch rec.State {
	case StateCompleted:
		return rec.result(true), notFree, nil
	case StateFailed:
		return rec.result(true), notFree, rec.storedError(true)
	}
	if rec.LeaseExpired {
		return Result{}, freeLeaseExpired, nil
	}
	return Result{}, freeAbsent, nil
}

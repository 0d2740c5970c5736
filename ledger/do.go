package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pipetx"
	"github.com/oncekit/oncekit/keys"
)

// Intent identifies one business intent and the payload it was made with. Every field
// is required, and the zero Intent is refused: [Ledger.Do], [Ledger.DoTx],
// [Ledger.DoStatement], [Ledger.Claim] and [Ledger.ClaimTx] check it before any SQL and return a
// [*keys.ValidationError] whose Field names what is wrong.
type Intent struct {
	// Scope is the tenant and the operation the key belongs to, each 1 to
	// keys.MaxScopeLen bytes of printable ASCII; otherwise a *keys.ValidationError
	// wrapping keys.ErrEmpty, keys.ErrTooLong or keys.ErrInvalidByte.
	Scope keys.Scope
	// Key names the intent within Scope, such as the key keys.Business returns: 1 to
	// [Config].MaxKeyLen bytes (keys.MaxLenDefault by default) of printable ASCII;
	// otherwise a *keys.ValidationError with Field "key".
	Key keys.Key
	// Fingerprint identifies the request the intent was made with: make it with
	// keys.FingerprintJSON(req) or keys.FingerprintBytes(body). The same Key with
	// another Fingerprint is refused with a [*FingerprintMismatchError]. There is no
	// default, since an empty fingerprint would make every request under a key look the
	// same: an empty or malformed one is a *keys.ValidationError wrapping
	// keys.ErrInvalidFingerprint, whose message names Intent.Fingerprint and says how to
	// make one.
	Fingerprint keys.Fingerprint
}

// Func is a mutation that runs inside the ledger's transaction. It writes through tx and
// returns the response to store. Returning a [*DefinitiveError] (or an error wrapping
// one) rolls its writes back and stores that failure, whatever state its statements left
// the transaction in (a failed INSERT included); any other error rolls everything back
// and leaves the key free. It must not commit or roll back tx.
//
// fn should write through tx only. A mutation that takes a second connection from the
// ledger's own pool while it runs holds two connections at once, and enough concurrent
// calls doing so starve the pool: every call then waits for a connection that only
// another waiting call could free.
type Func func(ctx context.Context, tx pgx.Tx) (Response, error)

// Mode is how a call of [Ledger.Do] or [Ledger.DoTx] claims its key: when the claim's
// answer arrives, and so whether fn is called, and whether its statements run, for a key
// another attempt holds or has completed. Every mode runs fn at most once per call, and
// only for an intent whose key it holds when it commits.
type Mode int

const (
	// ModeClaimWithFirstStatement, the zero Mode and so the default, sends the claim in
	// the round trip of fn's first statement, and the record with COMMIT: a first
	// execution whose fn sends one statement takes two round trips, those of the bare
	// transaction less BEGIN's. Of the modes that never run fn's statements for a taken
	// key, it costs least. fn is called before the claim's answer is known. When the key
	// is taken, fn's first statement does not run: the call waits for the key as Wait
	// allows and, when the attempt holding it fails, takes it and runs the statement
	// then; when the key's record decides the call (a replay, a stored failure, a reused
	// key, or in progress past the wait), the statement and every later one return an
	// error without running, and the call returns the record's answer whatever fn
	// returns. So fn must act through tx: anything it does before its first statement
	// happens even for a call that replays. A replay takes two round trips: the refused
	// claim, then the rollback with the read of the record (on connections in pgx's
	// default QueryExecModeCacheStatement, whose statements the ledger prepares by name).
	ModeClaimWithFirstStatement Mode = iota
	// ModeClaimFirst claims the key, and waits for the answer, before fn is called:
	// fn is never called for a key another attempt holds or completed. A first
	// execution takes one round trip more than ModeClaimWithFirstStatement, a replay
	// two. For fn that acts outside the database before its first statement, such as
	// an HTTP handler.
	ModeClaimFirst
	// ModeLookUpFirst reads the key's record before anything else, then claims as
	// ModeClaimFirst does: a replay takes one round trip and neither locks nor writes,
	// a first execution four. For calls that are mostly replays, such as an activity's
	// retries.
	ModeLookUpFirst
	// ModeOptimistic sends no claim: BEGIN travels with fn's first statement and the
	// record with COMMIT, and the record's primary key decides at commit. Of
	// concurrent attempts the first to commit wins; the others have their writes
	// rolled back and replay its result, whatever Wait says. fn runs, statements and
	// all, for a key another attempt holds or completed, so use it only for an fn that
	// acts through tx alone; a replay takes three round trips. A definitive failure is
	// stored by a second, claimed transaction; fn's other errors are checked against the
	// key's record before they are returned. In [Ledger.DoTx] it claims as
	// ModeClaimWithFirstStatement does: without a claim, an attempt would wait at its
	// record for as long as another caller's transaction lasts.
	ModeOptimistic
)

var modeNames = [...]string{"claim_with_first_statement", "claim_first", "look_up_first", "optimistic"}

func (m Mode) String() string {
	if m < 0 || int(m) >= len(modeNames) {
		return "Mode(" + strconv.Itoa(int(m)) + ")"
	}
	return modeNames[m]
}

// DoOpts are per-call options of [Ledger.Do] and [Ledger.DoTx]. A nil *DoOpts means
// all defaults.
type DoOpts struct {
	// Mode is how the call claims its key. Defaults to [ModeClaimWithFirstStatement],
	// the zero Mode; a value that is not one of the Mode constants is refused with an
	// error before any SQL.
	Mode Mode
	// Wait bounds how long the call waits for a concurrent attempt with the same key.
	// When that attempt completes in time its result is replayed; when it fails, this
	// call takes the key and runs fn; otherwise the call returns an [*InProgressError].
	// A context deadline that comes first ends the wait too, and the call returns the
	// context's error with DoTx's transaction usable. Waits beyond [MaxWait] are cut to
	// it. Defaults to 0: fail fast, as [NoWait] (any negative value) does.
	Wait time.Duration
	// Retention overrides how long this record is kept. Defaults to the operation's
	// retention from [Config] (Config.OperationRetention, then Config.Retention, then
	// [RetentionDefault]); a negative value is refused with an error before any SQL.
	Retention time.Duration
}

// Do runs fn under the key: exactly once per intent.
//
// On the first call it claims the key and runs fn in the same transaction, stores fn's
// response, and commits once, so the record and fn's writes exist together or not at
// all. A later call with the same intent returns the stored response with
// Result.Replayed set, and nothing fn does commits. The same key with a different
// fingerprint returns a [*FingerprintMismatchError], and nothing commits either.
// [DoOpts].Mode says when the claim's answer arrives, and so what such a call costs and
// whether fn is called at all: in [ModeLookUpFirst] a replay takes one round trip and
// neither locks nor writes; in the default mode it takes two, and fn's statements do
// not run.
func (l *Ledger) Do(ctx context.Context, in Intent, fn Func, opts *DoOpts) (res Result, err error) {
	ctx, c := l.tel.begin(ctx, "Do", in.Scope)
	defer l.endCall(c, in.Scope.Tenant, l.named, &res, &err)
	o := doOpts(opts)
	if err := l.precheck(ctx, in, fn, o); err != nil {
		return Result{}, err
	}
	conn, err := l.acquire(ctx, in.Scope.Tenant)
	if err != nil {
		return Result{}, err
	}
	defer conn.Release()
	return l.do(ctx, in, fn, o, &ownTx{l: l, conn: conn.Conn()})
}

// endCall ends the telemetry of a call that returns a [Result] with the call's outcome,
// then lets name name the tenant's shard in its error.
func (l *Ledger) endCall(c call, tenant string, name func(string, error) error, res *Result, err *error) {
	c.end(doOutcome(*res, *err), *err)
	*err = name(tenant, *err)
}

// acquire takes a connection of the tenant's shard.
func (l *Ledger) acquire(ctx context.Context, tenant string) (*pgxpool.Conn, error) {
	pool, err := l.r.Pool(tenant)
	if err != nil {
		return nil, err
	}
	return pool.Acquire(ctx)
}

// DoTx is [Ledger.Do] inside a transaction the caller holds: the claim, fn's writes and
// the stored response become part of tx, and commit or roll back with it. fn receives
// tx itself. When DoTx returns an error other than a stored failure, everything it did
// in tx has been rolled back to where it started, and tx remains usable, whatever fn
// did to it and in every pgx QueryExecMode.
//
// DoTx supports every isolation level. Under READ COMMITTED it sees intents other
// transactions completed while tx was open, and replays them. Under REPEATABLE READ and
// SERIALIZABLE, tx's snapshot cannot see an intent completed after the snapshot was
// taken: DoTx then returns a [*SnapshotConflictError] (SQLSTATE 40001) before fn's
// statements run (and before fn is called, in the modes that claim before it), and a
// retry of the whole transaction replays the result. It can learn of the conflict only
// at commit, after fn ran, when the record was written by an attempt that takes no
// claim: ModeOptimistic in Do, or [Ledger.Claim].
func (l *Ledger) DoTx(ctx context.Context, tx pgx.Tx, in Intent, fn Func, opts *DoOpts) (res Result, err error) {
	ctx, c := l.tel.begin(ctx, "DoTx", in.Scope)
	defer l.endCall(c, in.Scope.Tenant, l.named, &res, &err)
	o := doOpts(opts)
	if err := l.precheck(ctx, in, fn, o); err != nil {
		return Result{}, err
	}
	if tx == nil {
		return Result{}, errors.New("oncekit/ledger: DoTx needs a transaction")
	}
	if err := l.checkTx(tx, in.Scope.Tenant); err != nil {
		return Result{}, err
	}
	return l.do(ctx, in, fn, o, &callerTx{l: l, outer: tx})
}

func doOpts(opts *DoOpts) DoOpts {
	o := DoOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Wait < 0 {
		o.Wait = 0 // NoWait
	}
	return o
}

func (l *Ledger) precheck(ctx context.Context, in Intent, fn Func, o DoOpts) error {
	if err := l.validate(in.Scope, in.Key, in.Fingerprint); err != nil {
		return err
	}
	if fn == nil {
		return errNilFunc
	}
	if o.Retention < 0 {
		return errors.New("oncekit/ledger: DoOpts.Retention must not be negative")
	}
	if o.Mode < ModeClaimWithFirstStatement || o.Mode > ModeOptimistic {
		return fmt.Errorf("oncekit/ledger: DoOpts.Mode %d is not a Mode: use one of the Mode constants", int(o.Mode))
	}
	return ctx.Err()
}

func (l *Ledger) do(ctx context.Context, in Intent, fn Func, o DoOpts, lt localTx) (Result, error) {
	a := &attempt{l: l, in: in, lt: lt, w: newWait(ctx, o.Wait), mode: lt.mode(o.Mode)}
	if a.mode == ModeLookUpFirst {
		res, free, err := a.settle(ctx, true)
		switch free {
		case notFree:
			return res, err
		case freeLeaseExpired:
			return Result{}, a.inProgress()
		}
	}
	return a.execute(ctx, fn, l.retention(in.Scope.Operation, o.Retention))
}

// attempt is one call of Do or DoTx: its claim on the key, the wait for another attempt
// that holds the key, and the call's answer once the key's record decided it.
type attempt struct {
	l    *Ledger
	in   Intent
	lt   localTx
	w    wait
	mode Mode
	p    *pipetx.Tx
	// now is the clock of the attempt's claim, and so of its record: nil for the
	// database's, or Config.Test.NowFunc's reading when the key was last claimed.
	now *time.Time
	// record is the parameters of the record in flight, whose clock follows now.
	record []any

	decided bool
	res     Result
	err     error
}

// wait is how long a call may wait for another attempt: until Wait has passed since
// the call started, or the context's deadline, whichever comes first.
type wait struct {
	ctx   context.Context
	start time.Time
	until time.Time
}

func newWait(ctx context.Context, d time.Duration) wait {
	now := time.Now()
	return wait{ctx: ctx, start: now, until: now.Add(min(d, MaxWait))}
}

// left is how long the call may still wait, and whether the context's deadline, rather
// than Wait, bounds it.
func (w wait) left() (time.Duration, bool) {
	d := time.Until(w.until)
	if dl, ok := w.ctx.Deadline(); ok {
		if c := time.Until(dl); c < d {
			return c, true
		}
	}
	return d, false
}

// inProgress is the call's answer when another attempt held the key for all its wait.
func (a *attempt) inProgress() error {
	return &InProgressError{Scope: a.in.Scope, Key: a.in.Key, Waited: time.Since(a.w.start)}
}

// gaveUp is the call's answer when its wait ran out: the context's error when its
// deadline ended the wait, else in progress.
func (a *attempt) gaveUp(byCtx bool) error {
	if !byCtx {
		return a.inProgress()
	}
	if err := a.w.ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded // the server's timer ran out a moment before the context's
}

// decide records the call's answer, taken from the key's record while fn may be
// running; fn's statements return errClaimRefused from then on.
func (a *attempt) decide(res Result, err error) error {
	a.decided, a.res, a.err = true, res, err
	return errClaimRefused
}

// settle decides the call by the key's current record. With wait set, a pending
// record of Claim is waited for, polling, within the call's wait.
func (a *attempt) settle(ctx context.Context, wait bool) (Result, freedom, error) {
	return a.settleExpired(ctx, wait, false)
}

// settleExpired is settle; with expired set, a record that expired answers as if it
// had not: the record a commit met while it was live.
func (a *attempt) settleExpired(ctx context.Context, wait, expired bool) (Result, freedom, error) {
	until := a.w.start
	if wait {
		until = a.w.until
	}
	return a.l.settleQ(ctx, a.lt.q(), a.in, until.Sub(a.w.start), a.w.start, expired)
}

// onRefused runs when the claim was refused: another attempt holds the key, or its
// record is live. It rolls the attempt back, and decides the call by the record, or
// waits for the attempt holding the key and takes the key when that attempt is done,
// holding the key's lock in an open transaction (or savepoint) in which the claim is
// sent again.
func (a *attempt) onRefused(ctx context.Context) (*pipetx.Resume, error) {
	if err := a.lt.abort(context.WithoutCancel(ctx), a.p); err != nil {
		return nil, a.decide(Result{}, fmt.Errorf("oncekit/ledger: roll back the refused claim of %s in %s: %w", quoteKey(a.in.Key), a.in.Scope, err))
	}
	res, free, err := a.settle(ctx, true)
	switch free {
	case notFree:
		return nil, a.decide(res, err)
	case freeLeaseExpired:
		// A lapsed claim of Claim: only Claim may take it over.
		return nil, a.decide(Result{}, a.inProgress())
	}
	// No live record, so an attempt in flight holds the key's lock: wait for it.
	d, byCtx := a.w.left()
	if d <= 0 {
		return nil, a.decide(Result{}, a.gaveUp(byCtx))
	}
	now := a.l.now()
	resume, err := a.lt.hold(ctx, a.in, a.mode, now, d)
	switch {
	case err == nil && ctx.Err() != nil:
		// The key is ours, but the call's time ran out: send nothing more.
		if aerr := a.lt.abort(context.WithoutCancel(ctx), nil); aerr != nil {
			return nil, a.decide(Result{}, errors.Join(ctx.Err(), aerr))
		}
		return nil, a.decide(Result{}, ctx.Err())
	case err == nil:
		// The record is judged by the clock of the claim that took the key.
		a.now = now
		if a.record != nil {
			a.record[3] = now
		}
		return resume, nil
	case pgsql.Code(err) == pgsql.LockNotAvailable:
		return nil, a.decide(Result{}, a.gaveUp(byCtx))
	}
	return nil, a.decide(Result{}, fmt.Errorf("oncekit/ledger: wait for %s in %s: %w", quoteKey(a.in.Key), a.in.Scope, err))
}

// execute claims the key as the call's mode says, runs fn and finishes the transaction
// by fn's outcome.
func (a *attempt) execute(ctx context.Context, fn Func, retention time.Duration) (res Result, err error) {
	l, lt, in := a.l, a.lt, a.in
	cleanup := context.WithoutCancel(ctx)
	a.now = l.now()
	p := lt.begin(in, a.mode, a.now, a.onRefused)
	a.p = p
	if a.mode == ModeClaimFirst || a.mode == ModeLookUpFirst {
		if err := p.Flush(ctx); err != nil {
			if a.decided {
				return a.res, a.err
			}
			return Result{}, a.failed(cleanup, fmt.Errorf("oncekit/ledger: claim %s in %s: %w", quoteKey(in.Key), in.Scope, err))
		}
	}
	defer func() {
		if r := recover(); r != nil {
			if !a.decided {
				_ = lt.abort(cleanup, p)
			}
			panic(r)
		}
	}()
	// The record's statement is built before fn runs, its response left to fill in: the
	// time between fn's last result and the record's round trip is time the server
	// waits, and on a machine whose idle CPUs sleep a moment there costs more than its
	// length.
	origin := originArgs(ctx)
	done, doneArgs := l.completedBatch(in, retention, origin, lt.end())
	resp, fnErr := fn(ctx, p)
	if a.decided {
		return a.res, a.err
	}
	if err := p.Err(); err != nil && !p.Refused() {
		// The prefix failed: the claim could not be sent, or the snapshot cannot see a
		// record another transaction committed.
		return Result{}, a.failed(cleanup, err)
	}
	var derr *DefinitiveError
	if a.mode == ModeOptimistic && fnErr != nil {
		// No savepoint and no claim: undo everything, then decide without fn's writes.
		if err := lt.abort(cleanup, p); err != nil {
			return Result{}, errors.Join(unstored(fnErr), err)
		}
		if errors.As(fnErr, &derr) {
			// Store the failure under a claim, as a claiming mode would; fn is not
			// called again.
			failed := func(context.Context, pgx.Tx) (Response, error) { return Response{}, fnErr }
			b := &attempt{l: l, in: in, lt: lt, w: a.w, mode: ModeClaimFirst}
			return b.execute(ctx, failed, retention)
		}
		// fn may have failed because the intent was carried out before: then its
		// record, not fn's error, is the answer.
		res, free, err := a.settle(ctx, false)
		var mm *FingerprintMismatchError
		if free == notFree && (err == nil || errors.As(err, &derr) || errors.As(err, &mm)) {
			return res, err
		}
		return Result{}, fnErr
	}
	created := l.recordedAt()
	if a.mode == ModeOptimistic {
		// No claim to agree with: the record is judged by the clock at its commit.
		a.now = l.now()
	}
	var what string
	switch {
	case fnErr != nil && errors.As(fnErr, &derr):
		if derr.Response != nil {
			if err := l.checkResponse(*derr.Response); err != nil {
				if aerr := lt.abort(cleanup, p); aerr != nil {
					return Result{}, errors.Join(err, aerr)
				}
				return Result{}, err
			}
		}
		what = "store failure"
		a.record = l.failedArgs(in, derr, retention, created, a.now, origin)
		err = commitFailure(ctx, lt, p, recordBatch(l.q.insertFailed, a.record, lt.end()))
	case fnErr != nil:
		if err := lt.abort(cleanup, p); err != nil {
			return Result{}, errors.Join(fnErr, err)
		}
		return Result{}, fnErr
	default:
		if err := l.checkResponse(resp); err != nil {
			if aerr := lt.abort(cleanup, p); aerr != nil {
				return Result{}, errors.Join(err, aerr)
			}
			return Result{}, err
		}
		if faultpoint.At(ctx, faultpoint.BeforeCommit, nil, nil) == faultpoint.Crash {
			// A test's fault plan: the process dies with fn's writes done and not
			// committed; PostgreSQL rolls them back with the connection.
			return Result{}, errors.Join(faultpoint.ErrCrashed, lt.abort(cleanup, p))
		}
		what = "store result"
		setCompleted(doneArgs, resp, created, a.now)
		a.record = doneArgs
		err = finish(ctx, lt, p, done)
	}
	if a.decided {
		// fn sent no statement, and the claim travelled with the record and was refused.
		return a.res, a.err
	}
	if err != nil {
		aerr := lt.abort(cleanup, p)
		if aerr == nil && recordConflict(err) {
			return a.afterConflict(ctx, err)
		}
		if errors.Is(err, ErrTxAborted) {
			return Result{}, errors.Join(err, aerr)
		}
		if _, own := lt.(*ownTx); own && pgsql.CommitUnknown(err) {
			// COMMIT was sent and no clean answer came back: a FATAL after the commit
			// became durable, a connection cut before the answer, a context that ended.
			return Result{}, &OutcomeUnknownError{Scope: in.Scope, Key: in.Key, Err: errors.Join(err, aerr)}
		}
		return Result{}, fmt.Errorf("oncekit/ledger: %s of %s in %s: %w", what, quoteKey(in.Key), in.Scope, errors.Join(err, aerr))
	}
	if derr != nil {
		return Result{CreatedAt: created, Attempts: 1}, fnErr
	}
	return Result{Response: resp, Attempts: 1, CreatedAt: created}, nil
}

// errNilFunc is a programmer's mistake, which no caller acts on at run time.
var errNilFunc = errors.New("oncekit/ledger: nil function: pass the mutation to run")

// unstored hides a definitive failure that was not stored behind an error that is not
// one, so that errors.As finds no DefinitiveError in the call's answer: a caller that
// finds one rightly takes the failure as recorded. Only the failure's text is kept.
func unstored(err error) error {
	var derr *DefinitiveError
	if errors.As(err, &derr) {
		return errors.New("oncekit/ledger: the definitive failure was not stored: " + err.Error())
	}
	return err
}

// failed rolls the attempt back after its prefix failed, and says why. A prefix that
// failed with a serialization failure met, under REPEATABLE READ or SERIALIZABLE, a
// record the caller's snapshot cannot see.
func (a *attempt) failed(ctx context.Context, err error) error {
	if aerr := a.lt.abort(ctx, a.p); aerr != nil {
		return errors.Join(err, aerr)
	}
	if pgsql.Code(err) == pgsql.SerializationFailure {
		if _, ok := a.lt.(*callerTx); ok {
			return &SnapshotConflictError{Scope: a.in.Scope, Key: a.in.Key}
		}
	}
	return err
}

// recordConflict reports whether the record's statement met another attempt's record:
// a live record (the record statement's conflict clause then breaks the state check),
// or, under REPEATABLE READ and SERIALIZABLE, one the snapshot cannot see.
func recordConflict(err error) bool {
	switch pgsql.Code(err) {
	case pgsql.CheckViolation, pgsql.UniqueViolation, pgsql.SerializationFailure:
		return true
	}
	return false
}

// afterConflict answers a call whose record met another attempt's at commit. fn has run
// and its writes were rolled back; it is not run again: the other attempt's record is
// the answer, waited for within the call's wait while it is pending.
func (a *attempt) afterConflict(ctx context.Context, cause error) (Result, error) {
	serialization := pgsql.Code(cause) == pgsql.SerializationFailure
	// The record this commit met was live then; if it has expired since, it still
	// answers this call.
	res, free, err := a.settleExpired(ctx, !serialization, !serialization)
	if free == notFree {
		return res, err
	}
	if serialization {
		if _, ok := a.lt.(*callerTx); ok && a.l.liveRecord(ctx, a.in) {
			return Result{}, &SnapshotConflictError{Scope: a.in.Scope, Key: a.in.Key}
		}
		// The transaction's own serialization failure: retry the whole call.
		return Result{}, fmt.Errorf("oncekit/ledger: store result of %s in %s: %w", quoteKey(a.in.Key), a.in.Scope, cause)
	}
	// The record that met this one is gone again (released, evicted), or is an
	// claim of Claim whose lease ran out.
	return Result{}, a.inProgress()
}

// liveRecord reports whether a live record of in exists, read outside any caller's
// snapshot.
func (l *Ledger) liveRecord(ctx context.Context, in Intent) bool {
	pool, err := l.r.Pool(in.Scope.Tenant)
	if err != nil {
		return false
	}
	rec, err := l.lookup(ctx, pool, in.Scope, in.Key)
	return err == nil && rec != nil && !rec.Expired
}

// freedom says why settle found the key free to claim, or that it did not.
type freedom int

const (
	notFree          freedom = iota // the record decided the call
	freeAbsent                      // no record, or an expired one
	freeLeaseExpired                // a pending record of Claim whose lease ran out
)

// A call waiting for another attempt's claim of Claim reads the record again
// after pollFirst, doubling up to pollMax.
const (
	pollFirst = 5 * time.Millisecond
	pollMax   = 250 * time.Millisecond
)

// settleQ decides a call by the key's current record, read through q. A pending record
// with a live lease is waited for, polling, until wait has passed since start. An
// expired record counts as absent, unless expired is set.
func (l *Ledger) settleQ(ctx context.Context, q querier, in Intent, wait time.Duration, start time.Time, expired bool) (Result, freedom, error) {
	backoff := pollFirst
	slept := false
	defer func() {
		if slept {
			l.tel.waited(ctx, in.Scope.Operation, time.Since(start))
		}
	}()
	for {
		rec, err := l.lookup(ctx, q, in.Scope, in.Key)
		if err != nil {
			return Result{}, notFree, fmt.Errorf("oncekit/ledger: read %s in %s: %w", quoteKey(in.Key), in.Scope, err)
		}
		if rec == nil || (rec.Expired && !expired) {
			return Result{}, freeAbsent, nil
		}
		if res, free, err := l.judge(in, rec); free != freeAbsent {
			return res, free, err
		}
		// Pending under a lease of Claim: someone holds it, live.
		left := wait - time.Since(start)
		if left <= 0 {
			return Result{}, notFree, &InProgressError{Scope: in.Scope, Key: in.Key, LeaseUntil: rec.LeaseUntil, Waited: time.Since(start)}
		}
		slept = true
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{}, notFree, ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, pollMax)
	}
}

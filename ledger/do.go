package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
)

// Intent identifies one business intent and the payload it was made with.
type Intent struct {
	Scope       keys.Scope
	Key         keys.Key
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

// DoOpts are per-call options of [Ledger.Do] and [Ledger.DoTx]. A nil *DoOpts means
// all defaults.
type DoOpts struct {
	// Wait bounds how long the call waits for a concurrent attempt with the same key;
	// when it finishes in time its result is replayed, otherwise the call returns an
	// [*InProgressError]. Waits beyond [MaxWait] are cut to it. Defaults to
	// [WaitDefault]: fail fast; [NoWait] (any negative value) fails fast too.
	Wait time.Duration
	// Retention overrides how long this record is kept. Defaults to the operation's
	// retention from [Config].
	Retention time.Duration
	// ClaimFirst claims the key before looking for a stored result, and the claim's
	// answer arrives before fn runs, as without it: a first execution takes one round
	// trip fewer, and a replay one more (the refused claim, then its rollback together
	// with the read of the result). For callers whose requests are mostly first ones,
	// such as an HTTP API. Defaults to false.
	ClaimFirst bool
	// FirstAttempt says the caller expects this to be the key's first execution, and
	// trades the claim before fn for speed. Use it only for an fn that acts through tx
	// alone, since fn may run for an intent that turns out to be taken; whatever it wrote
	// is then rolled back and the key's record answers the call, as always. Defaults to
	// false: the call looks up the key, and claims it before fn runs.
	//
	// In [Ledger.Do] the first attempt is optimistic: it sends no claim at all. BEGIN
	// travels with fn's first statement and the record with COMMIT, so a first
	// execution whose fn sends one statement takes two round trips, one fewer than
	// pgx.BeginFunc with that statement alone, and costs what the bare transaction plus
	// one row does. The record's primary key decides at commit: of concurrent attempts
	// the first to commit wins, and the others have their writes rolled back and replay
	// its result, whatever Wait says (an attempt whose record meets an uncommitted one
	// waits for that transaction); a stored result found at commit is replayed, so a
	// replay costs three round trips instead of one. A definitive failure is stored by a
	// second, claimed transaction; fn's other errors are checked against the key's record
	// before they are returned.
	//
	// In [Ledger.DoTx] the claim travels in the round trip of fn's first statement; if
	// the key is taken, that statement and every later one fail without running.
	FirstAttempt bool
}

// Do runs fn under the key: exactly once per intent.
//
// On the first call it claims the key and runs fn in the same transaction, stores fn's
// response, and commits once, so the record and fn's writes exist together or not at
// all. A later call with the same intent returns the stored response with
// Result.Replayed set and runs nothing; when the key is completed that takes one round
// trip and neither locks nor writes. The same key with a different fingerprint returns a
// [*FingerprintMismatchError] and runs nothing.
func (l *Ledger) Do(ctx context.Context, in Intent, fn Func, opts *DoOpts) (res Result, err error) {
	ctx, c := l.tel.begin(ctx, "Do", in.Scope)
	defer func() { c.end(doOutcome(res, err), err) }()
	o := doOpts(opts)
	if err := l.precheck(ctx, in, fn, o); err != nil {
		return Result{}, err
	}
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return Result{}, err
	}
	defer conn.Release()
	return l.do(ctx, in, fn, o, &ownTx{l: l, conn: conn.Conn()})
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
// taken: DoTx then returns a [*SnapshotConflictError] (SQLSTATE 40001), and a retry of
// the whole transaction replays the result.
func (l *Ledger) DoTx(ctx context.Context, tx pgx.Tx, in Intent, fn Func, opts *DoOpts) (res Result, err error) {
	ctx, c := l.tel.begin(ctx, "DoTx", in.Scope)
	defer func() { c.end(doOutcome(res, err), err) }()
	o := doOpts(opts)
	if err := l.precheck(ctx, in, fn, o); err != nil {
		return Result{}, err
	}
	if tx == nil {
		return Result{}, errors.New("oncekit/ledger: DoTx needs a transaction")
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
		return ErrNilFunc
	}
	if o.Retention < 0 {
		return errors.New("oncekit/ledger: DoOpts.Retention must not be negative")
	}
	return ctx.Err()
}

const maxClaimTries = 5

func (l *Ledger) do(ctx context.Context, in Intent, fn Func, o DoOpts, lt localTx) (Result, error) {
	start := time.Now()
	retention := l.retention(in.Scope.Operation, o.Retention)
	lookFirst := !o.FirstAttempt && !o.ClaimFirst
	for try := 0; ; try++ {
		if lookFirst {
			res, free, err := l.settle(ctx, lt, in, o.Wait, start)
			if free == notFree {
				return res, err
			}
		}
		// Only a first attempt's first try runs fn before the claim's answer is known;
		// every other try claims first.
		mode := claimFirst
		if o.FirstAttempt && try == 0 {
			mode = lt.firstAttemptMode()
		}
		res, execErr, decided := l.execute(ctx, in, fn, lt, retention, mode)
		if decided {
			return res, execErr
		}
		// The claim was refused, or the commit met a record: decide by the record.
		res, free, err := l.settle(ctx, lt, in, o.Wait, start)
		switch free {
		case notFree:
			return res, err
		case freeAbsent:
			if errors.Is(execErr, errCommitConflict) {
				if _, ok := lt.(*callerTx); ok {
					// The record exists but this transaction's snapshot cannot see it.
					return Result{}, &SnapshotConflictError{Scope: in.Scope, Key: in.Key}
				}
				break // purged since the commit met it: claim again
			}
			// Another attempt holds the key and has not committed: wait for it, or
			// fail fast.
			left := o.Wait - time.Since(start)
			if left <= 0 {
				return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
			}
			if err := lt.waitFor(ctx, l.lockKey(in), left); err != nil {
				if pgsql.Code(err) == pgsql.LockNotAvailable {
					return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
				}
				return Result{}, fmt.Errorf("oncekit/ledger: wait for %s in %s: %w", quoteKey(in.Key), in.Scope, err)
			}
		case freeExpired:
			if err := lt.deleteExpired(ctx, in); err != nil {
				return Result{}, fmt.Errorf("oncekit/ledger: remove the expired record of %s in %s: %w", quoteKey(in.Key), in.Scope, err)
			}
		case freeLeaseExpired:
			// A lapsed external-mode claim: only Claim may take it over.
			return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
		}
		if try == maxClaimTries {
			return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
		}
		lookFirst = free != freeExpired
	}
}

// errCommitConflict marks a commit that met a record committed by another attempt.
var errCommitConflict = errors.New("oncekit/ledger: the key was recorded by another attempt")

// claimMode is how an execution claims its key.
type claimMode int

const (
	// claimFirst sends the claim, and waits for its answer, before fn runs.
	claimFirst claimMode = iota
	// claimWithFirstStatement sends the claim in the round trip of fn's first statement.
	claimWithFirstStatement
	// optimistic sends no claim: the record's primary key decides at commit.
	optimistic
)

// execute claims the key, runs fn and finishes the transaction by fn's outcome. decided
// is false when the claim was refused or the commit met another attempt's record: then
// nothing of this attempt remains, and the key's record decides the call.
func (l *Ledger) execute(ctx context.Context, in Intent, fn Func, lt localTx, retention time.Duration, mode claimMode) (res Result, err error, decided bool) {
	cleanup := context.WithoutCancel(ctx)
	p := lt.begin(in, mode)
	if mode == claimFirst {
		if err := p.Flush(ctx); err != nil && !p.Refused() {
			if aerr := lt.abort(cleanup, p); aerr != nil {
				err = errors.Join(err, aerr)
			}
			return Result{}, fmt.Errorf("oncekit/ledger: claim %s in %s: %w", quoteKey(in.Key), in.Scope, err), true
		}
	}
	defer func() {
		if r := recover(); r != nil {
			_ = lt.abort(cleanup, p)
			panic(r)
		}
	}()
	// The record's statement is built before fn runs, its response left to fill in: the
	// time between fn's last result and the record's round trip is time the server
	// waits, and on a machine whose idle CPUs sleep a moment there costs more than its
	// length.
	done, doneArgs := l.completedBatch(in, retention, lt.end())
	var resp Response
	var fnErr error
	if !p.Refused() {
		resp, fnErr = fn(ctx, p)
	}
	if p.Refused() {
		if err := lt.abort(cleanup, p); err != nil {
			return Result{}, fmt.Errorf("oncekit/ledger: roll back the refused claim of %s in %s: %w", quoteKey(in.Key), in.Scope, err), true
		}
		return Result{}, nil, false
	}
	var derr *DefinitiveError
	if mode == optimistic && fnErr != nil {
		// No savepoint and no claim: undo everything, then decide without fn's writes.
		if err := lt.abort(cleanup, p); err != nil {
			return Result{}, errors.Join(fnErr, err), true
		}
		if errors.As(fnErr, &derr) {
			// Store the failure under a claim, as a claim-first execution would.
			failed := func(context.Context, pgx.Tx) (Response, error) { return Response{}, fnErr }
			return l.execute(ctx, in, failed, lt, retention, claimFirst)
		}
		// fn may have failed because the intent was carried out before: then its
		// record, not fn's error, is the answer.
		res, free, err := l.settle(ctx, lt, in, 0, time.Now())
		var mm *FingerprintMismatchError
		if free == notFree && (err == nil || errors.As(err, &derr) || errors.As(err, &mm)) {
			return res, err, true
		}
		return Result{}, fnErr, true
	}
	created := l.recordedAt()
	var what string
	switch {
	case fnErr != nil && errors.As(fnErr, &derr):
		what = "store failure"
		err = commitFailure(ctx, lt, p, recordBatch(l.q.insertFailed, l.failedArgs(in, derr, retention, created), lt.end()))
	case fnErr != nil:
		if err := lt.abort(cleanup, p); err != nil {
			return Result{}, errors.Join(fnErr, err), true
		}
		return Result{}, fnErr, true
	default:
		if err := l.checkResponse(resp); err != nil {
			if aerr := lt.abort(cleanup, p); aerr != nil {
				return Result{}, errors.Join(err, aerr), true
			}
			return Result{}, err, true
		}
		if faultpoint.At(ctx, faultpoint.BeforeCommit, nil, nil) == faultpoint.Crash {
			// A test's fault plan: the process dies with fn's writes done and not
			// committed; PostgreSQL rolls them back with the connection.
			return Result{}, errors.Join(faultpoint.ErrCrashed, lt.abort(cleanup, p)), true
		}
		what = "store result"
		setCompleted(doneArgs, resp, created)
		err = finish(ctx, lt, p, done)
	}
	if err != nil {
		aerr := lt.abort(cleanup, p)
		if p.Refused() || pgsql.IsUniqueViolation(err, recordsPkey) {
			if aerr != nil {
				return Result{}, fmt.Errorf("oncekit/ledger: roll back the refused claim of %s in %s: %w", quoteKey(in.Key), in.Scope, aerr), true
			}
			return Result{}, errCommitConflict, false
		}
		if errors.Is(err, ErrTxAborted) {
			return Result{}, errors.Join(err, aerr), true
		}
		return Result{}, fmt.Errorf("oncekit/ledger: %s of %s in %s: %w", what, quoteKey(in.Key), in.Scope, errors.Join(err, aerr)), true
	}
	if derr != nil {
		return Result{CreatedAt: created, Attempts: 1}, fnErr, true
	}
	return Result{Response: resp, Attempts: 1, CreatedAt: created}, nil, true
}

// freedom says why settle found the key free to claim, or that it did not.
type freedom int

const (
	notFree          freedom = iota // the record decided the call
	freeAbsent                      // no record
	freeExpired                     // an expired record, to be removed
	freeLeaseExpired                // a pending external-mode record whose lease ran out
)

// settle decides a call by the key's current record. A pending record is waited for,
// polling, until wait has passed since start. When the key is free it says why.
func (l *Ledger) settle(ctx context.Context, lt localTx, in Intent, wait time.Duration, start time.Time) (Result, freedom, error) {
	return l.settleQ(ctx, lt.q(), in, wait, start)
}

// A call waiting for another attempt's key reads the record again after pollFirst,
// doubling up to pollMax.
const (
	pollFirst = 5 * time.Millisecond
	pollMax   = 250 * time.Millisecond
)

func (l *Ledger) settleQ(ctx context.Context, q querier, in Intent, wait time.Duration, start time.Time) (Result, freedom, error) {
	backoff := pollFirst
	slept := false
	defer func() {
		if slept {
			l.tel.waited(in.Scope.Operation, time.Since(start))
		}
	}()
	for {
		rec, err := l.lookup(ctx, q, in.Scope, in.Key)
		if err != nil {
			return Result{}, notFree, fmt.Errorf("oncekit/ledger: read %s in %s: %w", quoteKey(in.Key), in.Scope, err)
		}
		if rec == nil {
			return Result{}, freeAbsent, nil
		}
		if rec.Expired {
			return Result{}, freeExpired, nil
		}
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
		// Pending in the external-effect mode: someone holds a lease.
		if rec.LeaseExpired {
			return Result{}, freeLeaseExpired, nil
		}
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

// recordsPkey is the primary key of the records table: a unique violation on it means
// another attempt recorded the key first.
const recordsPkey = "idempotency_records_pkey"

package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// one) stores that failure; any other error rolls everything back and leaves the key
// free. It must not commit or roll back tx.
type Func func(ctx context.Context, tx pgx.Tx) (Response, error)

// DoOpts are per-call options of [Ledger.Do] and [Ledger.DoTx]. A nil *DoOpts means
// all defaults.
type DoOpts struct {
	// Wait bounds how long the call waits for a concurrent attempt with the same key;
	// when it finishes in time its result is replayed, otherwise the call returns an
	// [*InProgressError]. Defaults to [WaitDefault]: fail fast.
	Wait time.Duration
	// Retention overrides how long this record is kept. Defaults to the operation's
	// retention from [Config].
	Retention time.Duration
	// FirstAttempt says the caller expects this to be the key's first execution (for
	// example attempt 1 of a Temporal activity): the call claims the key at once instead
	// of looking for a stored result first. A replay then costs one more round trip, and
	// a first execution one fewer. Defaults to false.
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
func (l *Ledger) Do(ctx context.Context, in Intent, fn Func, opts *DoOpts) (Result, error) {
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
// in tx has been rolled back to where it started, and tx remains usable.
func (l *Ledger) DoTx(ctx context.Context, tx pgx.Tx, in Intent, fn Func, opts *DoOpts) (Result, error) {
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
	if opts == nil {
		return DoOpts{Wait: WaitDefault}
	}
	return *opts
}

func (l *Ledger) precheck(ctx context.Context, in Intent, fn Func, o DoOpts) error {
	if err := l.validate(in.Scope, in.Key, in.Fingerprint); err != nil {
		return err
	}
	if fn == nil {
		return ErrNilFunc
	}
	if o.Wait < 0 || o.Retention < 0 {
		return errors.New("oncekit/ledger: DoOpts.Wait and DoOpts.Retention must not be negative")
	}
	return ctx.Err()
}

// localTx is the transaction a local-mode execution runs in: the ledger's own
// ([ownTx]) or the caller's ([callerTx]).
type localTx interface {
	// q reads records: outside any transaction for ownTx, inside the caller's for callerTx.
	q() querier
	// claim takes the key for this transaction. claimed is false when a live record
	// holds the key. A wait that runs out surfaces as a *pgconn.PgError with code 55P03.
	claim(ctx context.Context, in Intent, wait time.Duration) (claimed bool, err error)
	tx() pgx.Tx
	// commit stores the response and commits (or releases the caller's savepoint).
	commit(ctx context.Context, in Intent, resp Response, retention time.Duration) error
	// commitFailure undoes fn's writes, stores the failure and commits.
	commitFailure(ctx context.Context, in Intent, derr *DefinitiveError, retention time.Duration) error
	// abort undoes the claim and fn's writes.
	abort(ctx context.Context) error
}

const maxClaimTries = 5

func (l *Ledger) do(ctx context.Context, in Intent, fn Func, o DoOpts, lt localTx) (Result, error) {
	start := time.Now()
	if !o.FirstAttempt {
		if res, err, done := l.settle(ctx, lt.q(), in, o.Wait, start); done {
			return res, err
		}
	}
	for try := 0; ; try++ {
		wait := max(o.Wait-time.Since(start), 0)
		claimed, err := lt.claim(ctx, in, wait)
		if isLockTimeout(err) {
			return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
		}
		if err != nil {
			return Result{}, fmt.Errorf("oncekit/ledger: claim %q in %s: %w", in.Key, in.Scope, err)
		}
		if claimed {
			return l.execute(ctx, in, fn, lt, l.retention(in.Scope.Operation, o.Retention))
		}
		if res, err, done := l.settle(ctx, lt.q(), in, o.Wait, start); done {
			return res, err
		}
		// The holder rolled back between our claim and our read: claim again.
		if try == maxClaimTries {
			return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
		}
	}
}

// execute runs fn on a claimed key and finishes the transaction by fn's outcome.
func (l *Ledger) execute(ctx context.Context, in Intent, fn Func, lt localTx, retention time.Duration) (res Result, err error) {
	cleanup := context.WithoutCancel(ctx)
	defer func() {
		if p := recover(); p != nil {
			_ = lt.abort(cleanup)
			panic(p)
		}
	}()
	resp, fnErr := fn(ctx, managedTx{lt.tx()})
	var derr *DefinitiveError
	switch {
	case errors.As(fnErr, &derr):
		if err := lt.commitFailure(ctx, in, derr, retention); err != nil {
			_ = lt.abort(cleanup)
			return Result{}, fmt.Errorf("oncekit/ledger: store failure of %q in %s: %w", in.Key, in.Scope, err)
		}
		return Result{CreatedAt: time.Now(), Attempts: 1}, fnErr
	case fnErr != nil:
		if err := lt.abort(cleanup); err != nil {
			return Result{}, errors.Join(fnErr, err)
		}
		return Result{}, fnErr
	}
	if err := l.checkResponse(resp); err != nil {
		_ = lt.abort(cleanup)
		return Result{}, err
	}
	if err := lt.commit(ctx, in, resp, retention); err != nil {
		_ = lt.abort(cleanup)
		return Result{}, fmt.Errorf("oncekit/ledger: store result of %q in %s: %w", in.Key, in.Scope, err)
	}
	return Result{Response: resp, Attempts: 1, CreatedAt: time.Now()}, nil
}

// settle decides a call by the key's current record. done is false when the key is
// free (absent or expired) and the caller should claim it. A pending record is waited
// for, polling, until wait has passed since start.
func (l *Ledger) settle(ctx context.Context, q querier, in Intent, wait time.Duration, start time.Time) (res Result, err error, done bool) {
	backoff := 5 * time.Millisecond
	for {
		rec, err := l.lookup(ctx, q, in.Scope, in.Key)
		if err != nil {
			return Result{}, fmt.Errorf("oncekit/ledger: read %q in %s: %w", in.Key, in.Scope, err), true
		}
		if rec == nil || rec.Expired {
			return Result{}, nil, false
		}
		if rec.Fingerprint != in.Fingerprint {
			return Result{}, &FingerprintMismatchError{Scope: in.Scope, Key: in.Key, StoredFingerprint: rec.Fingerprint,
				Fingerprint: in.Fingerprint, StoredState: rec.State, StoredAt: rec.CreatedAt}, true
		}
		switch rec.State {
		case StateCompleted:
			return rec.result(true), nil, true
		case StateFailed:
			return rec.result(true), rec.storedError(true), true
		}
		// Pending in the external-effect mode: someone holds a lease.
		if rec.LeaseExpired {
			return Result{}, nil, false
		}
		left := wait - time.Since(start)
		if left <= 0 {
			return Result{}, &InProgressError{Scope: in.Scope, Key: in.Key, LeaseUntil: rec.LeaseUntil, Waited: time.Since(start)}, true
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{}, ctx.Err(), true
		case <-t.C:
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

func isOwnConflict(err error) bool { return pgsql.IsUniqueViolation(err, "idempotency_records_pkey") }

// managedTx hands fn the transaction without the power to end it.
type managedTx struct{ pgx.Tx }

func (managedTx) Commit(context.Context) error   { return ErrManagedTx }
func (managedTx) Rollback(context.Context) error { return ErrManagedTx }

package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
)

// ClaimOpts are per-call options of [Ledger.Claim]. A nil *ClaimOpts means all defaults.
type ClaimOpts struct {
	// Lease is how long the claim is owned before another attempt may take it over. Set
	// it longer than the external call can take. Defaults to [Config].Lease.
	Lease time.Duration
	// Wait bounds how long the call waits for another attempt's live claim to finish.
	// Defaults to 0: fail fast with an [*InProgressError], as [NoWait] does. In
	// [Ledger.ClaimTx], the claim's INSERT waits for a lock for at least 100 ms
	// whatever Wait says, so that a brief lock of another kind (one that extends the
	// table, under many inserters) is not taken for another attempt holding the key.
	Wait time.Duration
	// Retention overrides how long the record is kept. Defaults to the operation's
	// retention from [Config].
	Retention time.Duration
	// Token is the token to claim with. Defaults to a random one. An owner that can lose
	// track of its own claim, such as a workflow run whose activity completed the claim
	// but whose completion was lost, passes a token derived from its identity: a claim
	// that finds a pending record with a live lease under the same token resumes that
	// lease instead of waiting for it.
	Token uuid.UUID
}

// Lease is an owned claim on a key by Claim. Only the holder of the
// lease's token may complete, fail or release the record.
type Lease struct {
	Intent
	// Token fences the record: a finish with another token is refused.
	Token uuid.UUID
	// Until is when the lease runs out (by the database's clock).
	Until time.Time
	// Attempt counts the attempts that have owned this key, this one included.
	Attempt int
	// Redrive is true when an earlier attempt owned the key and did not finish it: the
	// external call may have happened, so make it again with the same downstream key
	// and let the provider deduplicate it.
	Redrive bool
	// Uncertain is true when an earlier attempt reported that its call may have happened.
	Uncertain bool
}

// ClaimResult is the outcome of [Ledger.Claim]: either a stored result to replay, or a
// lease to act under.
type ClaimResult struct {
	// Lease is set when this call owns the key and must make the external call.
	Lease *Lease
	// Result is the stored result when the key was already completed (Result.Replayed
	// is true); Lease is nil then.
	Result Result
}

// Claim claims the key before an external side effect, such as a call to a payment
// provider, and commits the claim at once so it survives a crash during the call.
// Then make the call and finish with [Ledger.Complete], [Ledger.Fail],
// [Ledger.MarkUncertain] or [Ledger.Release].
//
// A completed key replays its result (no lease). A pending key whose lease ran out is
// taken over with a fresh token, and the returned lease has Redrive set. A pending key
// with a live lease is waited for up to ClaimOpts.Wait, then reported as an
// [*InProgressError]. A stored failure is returned as a [*DefinitiveError].
func (l *Ledger) Claim(ctx context.Context, in Intent, opts *ClaimOpts) (ClaimResult, error) {
	pool, err := l.r.Pool(in.Scope.Tenant)
	if err != nil {
		return ClaimResult{}, err
	}
	return l.instrumentedClaim(ctx, pool, in, opts)
}

// ClaimTx is [Ledger.Claim] inside the caller's transaction; the claim takes effect
// when the caller commits, so commit before making the external call.
func (l *Ledger) ClaimTx(ctx context.Context, tx pgx.Tx, in Intent, opts *ClaimOpts) (ClaimResult, error) {
	if err := l.checkTx(tx, in.Scope.Tenant); err != nil {
		return ClaimResult{}, err
	}
	return l.instrumentedClaim(ctx, tx, in, opts)
}

func (l *Ledger) instrumentedClaim(ctx context.Context, q querier, in Intent, opts *ClaimOpts) (res ClaimResult, err error) {
	ctx, c := l.tel.begin(ctx, "Claim", in.Scope)
	defer func() { err = l.named(in.Scope.Tenant, err) }()
	defer func() {
		outcome := doOutcome(res.Result, err)
		if res.Lease != nil && res.Lease.Redrive {
			outcome = OutcomeRedrive
			l.tel.log.LogAttrs(ctx, slog.LevelWarn, "oncekit: an external claim whose lease ran out was taken over; the call is made again with the same downstream key",
				slog.String(AttrTenant, in.Scope.Tenant), slog.String(AttrOperation, in.Scope.Operation),
				slog.Int("oncekit.attempt", res.Lease.Attempt), slog.Bool("oncekit.uncertain", res.Lease.Uncertain))
		}
		c.end(outcome, err)
	}()
	return l.claim(ctx, q, in, opts)
}

// finish instruments Complete, Fail, Release, MarkUncertain and Extend.
func (l *Ledger) finish(ctx context.Context, name string, lease *Lease, ok string, f func(ctx context.Context) error) error {
	var scope keys.Scope
	if lease != nil {
		scope = lease.Scope
	}
	ctx, c := l.tel.begin(ctx, name, scope)
	err := f(ctx)
	c.end(finishOutcome(ok, err), err)
	return l.named(scope.Tenant, err)
}

func (l *Ledger) claim(ctx context.Context, q querier, in Intent, opts *ClaimOpts) (ClaimResult, error) {
	o := ClaimOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Lease == 0 {
		o.Lease = l.cfg.Lease
	}
	if o.Lease < 0 || o.Retention < 0 {
		return ClaimResult{}, errors.New("oncekit/ledger: ClaimOpts.Lease and Retention must not be negative")
	}
	if o.Wait < 0 {
		o.Wait = 0 // NoWait
	}
	if err := l.validate(in.Scope, in.Key, in.Fingerprint); err != nil {
		return ClaimResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return ClaimResult{}, err
	}
	if o.Token != uuid.Nil {
		if res, ok, err := l.resume(ctx, q, in, o.Token); ok || err != nil {
			return res, err
		}
	}
	origin := originArgs(ctx)
	start := time.Now()
	for {
		res, free, err := l.settleQ(ctx, q, in, o.Wait, start, false)
		if free == notFree {
			return ClaimResult{Result: res}, err
		}
		token := o.Token
		if token == uuid.Nil {
			token = uuid.New()
		}
		lease := &Lease{Intent: in, Token: token}
		var createdAt time.Time
		args := []any{in.Scope.Tenant, in.Scope.Operation, string(in.Key), l.now(),
			string(in.Fingerprint), token, pgsql.Interval(o.Lease), pgsql.Interval(l.retention(in.Scope.Operation, o.Retention)),
			origin[0], origin[1], origin[2], origin[3]}
		dest := []any{&lease.Attempt, &lease.Uncertain, &lease.Until, &createdAt}
		if tx, ok := q.(pgx.Tx); ok {
			err = l.claimInTx(ctx, tx, o.Wait-time.Since(start), args, dest)
			if pgsql.Code(err) == pgsql.LockNotAvailable {
				// An uncommitted attempt holds the key past the call's wait or deadline.
				if cerr := ctx.Err(); cerr != nil {
					return ClaimResult{}, cerr
				}
				return ClaimResult{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
			}
		} else {
			err = q.QueryRow(ctx, l.q.claim, args...).Scan(dest...)
		}
		if err == nil {
			lease.Redrive = lease.Attempt > 1
			return ClaimResult{Lease: lease, Result: Result{Attempts: lease.Attempt, CreatedAt: createdAt}}, nil
		}
		if _, inTx := q.(pgx.Tx); !inTx && pgsql.CommitUnknown(err) {
			// The claim commits by itself: it may have committed under token.
			return ClaimResult{}, &OutcomeUnknownError{Scope: in.Scope, Key: in.Key, Token: token, Err: err}
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ClaimResult{}, fmt.Errorf("oncekit/ledger: claim %q in %s: %w", in.Key, in.Scope, err)
		}
		// Another attempt claimed or finished the key between our read and our write:
		// read its record again, which waits for its lease within the call's wait.
		if time.Since(start) >= o.Wait {
			return ClaimResult{}, &InProgressError{Scope: in.Scope, Key: in.Key, Waited: time.Since(start)}
		}
	}
}

// claimLockFloor is the least time ClaimTx's INSERT waits for a lock, with or without
// a wait of the call's.
const claimLockFloor = 100 * time.Millisecond

// claimInTx sends the claim inside the caller's transaction, with its wait for another
// transaction's uncommitted record of the key bounded on the server by lock_timeout: by
// what is left of the call's wait, and never past the context's deadline. A deadline
// that pgx enforced would close the connection, and the caller's transaction with it;
// PostgreSQL's lock timeout fails the statement alone, which a savepoint undoes. The
// caller's lock_timeout is restored afterwards.
//
// The lock timeout is never under claimLockFloor: it bounds every lock the INSERT
// meets, not only the key's, and a fresh key's INSERT may wait briefly for a lock of
// another kind (such as the one that extends the table by a page, under many
// inserters), which is no other attempt holding the key.
func (l *Ledger) claimInTx(ctx context.Context, tx pgx.Tx, wait time.Duration, args, dest []any) error {
	wait = max(wait, claimLockFloor)
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT oncekit_claim")
	// args begin with the key's tenant, operation and key.
	b.Queue(l.q.keepLockTimeout, lockTimeout(wait), args[0], args[1], args[2])
	b.Queue(l.q.claim, args...)
	b.Queue(l.q.restoreLockTimeout, args[0], args[1], args[2])
	b.Queue("RELEASE SAVEPOINT oncekit_claim")
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(wait, 0)+holdGrace)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stop()
	br := tx.SendBatch(wctx, b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && pgsql.Code(err) != "" {
		// The statement failed on the server: undo the savepoint, and with it the
		// lock_timeout set inside it, so that the caller's transaction goes on.
		if _, rerr := tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT oncekit_claim; RELEASE SAVEPOINT oncekit_claim"); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	return err
}

// resume returns the lease of a pending record that token owns and whose lease is live.
func (l *Ledger) resume(ctx context.Context, q querier, in Intent, token uuid.UUID) (ClaimResult, bool, error) {
	rec, err := l.lookup(ctx, q, in.Scope, in.Key)
	if err != nil {
		return ClaimResult{}, false, fmt.Errorf("oncekit/ledger: read %s in %s: %w", quoteKey(in.Key), in.Scope, err)
	}
	if rec == nil || rec.Expired || rec.State != StatePending || rec.LeaseExpired ||
		rec.OwnerToken != token || rec.Fingerprint != in.Fingerprint {
		return ClaimResult{}, false, nil
	}
	lease := &Lease{Intent: in, Token: token, Until: rec.LeaseUntil, Attempt: rec.Attempts,
		Redrive: rec.Attempts > 1, Uncertain: rec.Uncertain}
	return ClaimResult{Lease: lease, Result: Result{Attempts: rec.Attempts, CreatedAt: rec.CreatedAt}}, true, nil
}

// Complete stores the external call's response and ends the lease. It returns a
// [*LeaseLostError] when the lease's token no longer owns the record.
func (l *Ledger) Complete(ctx context.Context, lease *Lease, resp Response) (res Result, err error) {
	err = l.finish(ctx, "Complete", lease, OutcomeCompleted, func(ctx context.Context) error {
		return l.onLease(lease, func(q querier) (err error) {
			res, err = l.complete(ctx, q, lease, resp)
			return err
		})
	})
	return res, err
}

// CompleteTx is [Ledger.Complete] inside the caller's transaction, so the caller can
// record the call's outcome in its own tables atomically with the ledger.
func (l *Ledger) CompleteTx(ctx context.Context, tx pgx.Tx, lease *Lease, resp Response) (res Result, err error) {
	err = l.finish(ctx, "Complete", lease, OutcomeCompleted, func(ctx context.Context) error {
		if err := l.checkLeaseTx(tx, lease); err != nil {
			return err
		}
		res, err = l.complete(ctx, tx, lease, resp)
		return err
	})
	return res, err
}

func (l *Ledger) complete(ctx context.Context, q querier, lease *Lease, resp Response) (Result, error) {
	if err := l.checkLease(lease); err != nil {
		return Result{}, err
	}
	if err := l.checkResponse(resp); err != nil {
		return Result{}, err
	}
	res := Result{Response: resp}
	err := q.QueryRow(ctx, l.q.complete, l.leaseArgs(lease, resp.Code, resp.Body, nullable(resp.ResourceRef))...).
		Scan(&res.Attempts, &res.CreatedAt)
	if err != nil {
		return Result{}, l.finishErr(ctx, q, lease, err)
	}
	return res, nil
}

// Fail stores a definitive failure for the key and ends the lease: every retry of the
// intent receives the same [*DefinitiveError].
func (l *Ledger) Fail(ctx context.Context, lease *Lease, derr *DefinitiveError) error {
	return l.finish(ctx, "Fail", lease, OutcomeFailed, func(ctx context.Context) error {
		return l.onLease(lease, func(q querier) error { return l.fail(ctx, q, lease, derr) })
	})
}

// FailTx is [Ledger.Fail] inside the caller's transaction.
func (l *Ledger) FailTx(ctx context.Context, tx pgx.Tx, lease *Lease, derr *DefinitiveError) error {
	return l.finish(ctx, "Fail", lease, OutcomeFailed, func(ctx context.Context) error {
		if err := l.checkLeaseTx(tx, lease); err != nil {
			return err
		}
		return l.fail(ctx, tx, lease, derr)
	})
}

func (l *Ledger) fail(ctx context.Context, q querier, lease *Lease, derr *DefinitiveError) error {
	if err := l.checkLease(lease); err != nil {
		return err
	}
	if derr == nil {
		return errors.New("oncekit/ledger: Fail needs a *DefinitiveError")
	}
	var attempts int32
	var created time.Time
	if derr.Response != nil {
		if err := l.checkResponse(*derr.Response); err != nil {
			return err
		}
	}
	code, body := failureResponse(derr)
	err := q.QueryRow(ctx, l.q.fail, l.leaseArgs(lease, derr.Code, derr.Message, code, body)...).Scan(&attempts, &created)
	if err != nil {
		return l.finishErr(ctx, q, lease, err)
	}
	return nil
}

// Release gives the key up: the external call did not happen, and the next attempt may
// start afresh (with any payload). Use [Ledger.MarkUncertain] instead when the call may
// have happened.
func (l *Ledger) Release(ctx context.Context, lease *Lease) error {
	return l.finish(ctx, "Release", lease, OutcomeReleased, func(ctx context.Context) error {
		return l.onLease(lease, func(q querier) error { return l.release(ctx, q, lease) })
	})
}

// ReleaseTx is [Ledger.Release] inside the caller's transaction.
func (l *Ledger) ReleaseTx(ctx context.Context, tx pgx.Tx, lease *Lease) error {
	return l.finish(ctx, "Release", lease, OutcomeReleased, func(ctx context.Context) error {
		if err := l.checkLeaseTx(tx, lease); err != nil {
			return err
		}
		return l.release(ctx, tx, lease)
	})
}

func (l *Ledger) release(ctx context.Context, q querier, lease *Lease) error {
	if err := l.checkLease(lease); err != nil {
		return err
	}
	tag, err := q.Exec(ctx, l.q.release, lease.Scope.Tenant, lease.Scope.Operation, string(lease.Key), lease.Token)
	if err == nil && tag.RowsAffected() == 0 {
		err = pgx.ErrNoRows
	}
	if err != nil {
		return l.finishErr(ctx, q, lease, err)
	}
	return nil
}

// MarkUncertain records that the external call may have happened (a timeout, a lost
// response) and ends the lease at once: the next attempt takes the key over with
// Redrive and Uncertain set and must repeat the call with the same downstream key.
// The record keeps its fingerprint, so a retry with another payload is refused.
func (l *Ledger) MarkUncertain(ctx context.Context, lease *Lease) error {
	return l.finish(ctx, "MarkUncertain", lease, OutcomeUncertain, func(ctx context.Context) error {
		return l.onLease(lease, func(q querier) error { return l.markUncertain(ctx, q, lease) })
	})
}

// MarkUncertainTx is [Ledger.MarkUncertain] inside the caller's transaction.
func (l *Ledger) MarkUncertainTx(ctx context.Context, tx pgx.Tx, lease *Lease) error {
	return l.finish(ctx, "MarkUncertain", lease, OutcomeUncertain, func(ctx context.Context) error {
		if err := l.checkLeaseTx(tx, lease); err != nil {
			return err
		}
		return l.markUncertain(ctx, tx, lease)
	})
}

func (l *Ledger) markUncertain(ctx context.Context, q querier, lease *Lease) error {
	if err := l.checkLease(lease); err != nil {
		return err
	}
	tag, err := q.Exec(ctx, l.q.uncertain, l.leaseArgs(lease)...)
	if err == nil && tag.RowsAffected() == 0 {
		err = pgx.ErrNoRows
	}
	if err != nil {
		return l.finishErr(ctx, q, lease, err)
	}
	return nil
}

// Extend renews the lease for d from now, for a call that takes longer than planned.
// It updates lease.Until.
func (l *Ledger) Extend(ctx context.Context, lease *Lease, d time.Duration) error {
	err := l.onLease(lease, func(q querier) error { return l.extend(ctx, q, lease, d) })
	if lease != nil {
		err = l.named(lease.Scope.Tenant, err)
	}
	return err
}

// ExtendTx is [Ledger.Extend] inside the caller's transaction.
func (l *Ledger) ExtendTx(ctx context.Context, tx pgx.Tx, lease *Lease, d time.Duration) error {
	if err := l.checkLeaseTx(tx, lease); err != nil {
		return err
	}
	return l.extend(ctx, tx, lease, d)
}

func (l *Ledger) extend(ctx context.Context, q querier, lease *Lease, d time.Duration) error {
	if err := l.checkLease(lease); err != nil {
		return err
	}
	if d <= 0 {
		return errors.New("oncekit/ledger: Extend needs a positive duration")
	}
	var until time.Time
	if err := q.QueryRow(ctx, l.q.extend, l.leaseArgs(lease, pgsql.Interval(d))...).Scan(&until); err != nil {
		return l.finishErr(ctx, q, lease, err)
	}
	lease.Until = until
	return nil
}

func (l *Ledger) checkLease(lease *Lease) error {
	if lease == nil {
		return errors.New("oncekit/ledger: nil lease: pass the lease returned by Claim")
	}
	if lease.Token == uuid.Nil {
		return errors.New("oncekit/ledger: lease has no token: pass the lease returned by Claim")
	}
	if err := lease.Scope.Validate(); err != nil {
		return err
	}
	return lease.Key.ValidateLen(l.cfg.MaxKeyLen)
}

func (l *Ledger) leaseArgs(lease *Lease, extra ...any) []any {
	return append([]any{lease.Scope.Tenant, lease.Scope.Operation, string(lease.Key), l.now(), lease.Token}, extra...)
}

// finishErr turns "no row matched the token" into a LeaseLostError with the record as
// it is now.
func (l *Ledger) finishErr(ctx context.Context, q querier, lease *Lease, err error) error {
	if _, inTx := q.(pgx.Tx); !inTx && pgsql.CommitUnknown(err) {
		// The statement commits by itself, and its answer was lost.
		return &OutcomeUnknownError{Scope: lease.Scope, Key: lease.Key, Token: lease.Token, Err: err}
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("oncekit/ledger: finish %q in %s: %w", lease.Key, lease.Scope, err)
	}
	cur, lerr := l.lookup(ctx, q, lease.Scope, lease.Key)
	if lerr != nil {
		return fmt.Errorf("oncekit/ledger: finish %q in %s: %w", lease.Key, lease.Scope, lerr)
	}
	return &LeaseLostError{Scope: lease.Scope, Key: lease.Key, Current: cur}
}

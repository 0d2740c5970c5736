package ledger

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
)

// Sentinel conditions. Typed errors below match them with [errors.Is].
var (
	// ErrNotFound: no record exists for the key.
	ErrNotFound = errors.New("oncekit/ledger: no record for this key")
	// ErrInProgress: another attempt holds the key. Retry later; the retry will replay
	// the result once the other attempt finishes.
	ErrInProgress = errors.New("oncekit/ledger: another attempt with this key is in progress")
	// ErrFingerprintMismatch: the key was used before with a different payload.
	ErrFingerprintMismatch = errors.New("oncekit/ledger: key reused with a different payload")
	// ErrLeaseLost: the caller no longer owns the claim it tries to finish.
	ErrLeaseLost = errors.New("oncekit/ledger: lease lost")
	// ErrBodyTooLarge: a result body is over the configured limit.
	ErrBodyTooLarge = errors.New("oncekit/ledger: result body too large")
	// ErrManagedTx: the function tried to commit or roll back the ledger's transaction.
	ErrManagedTx = errors.New("oncekit/ledger: the ledger commits and rolls back its own transaction: return a result or an error instead")
	// ErrOutcomeUnknown: the commit was sent and no answer came back; see
	// [OutcomeUnknownError].
	ErrOutcomeUnknown = errors.New("oncekit/ledger: the outcome of the call is unknown")
	// ErrTxAborted: the mutation returned a result although one of its statements failed
	// and aborted the transaction, so its writes cannot commit. Nothing was stored.
	ErrTxAborted = errors.New("oncekit/ledger: a statement of the mutation failed and aborted the transaction, yet the mutation returned a result: return the statement's error, or a *DefinitiveError to store the failure")
)

// FingerprintMismatchError reports that a key was reused with a different payload. The
// mutation did not run. It carries the stored record's identity.
type FingerprintMismatchError struct {
	Scope             keys.Scope
	Key               keys.Key
	StoredFingerprint keys.Fingerprint
	Fingerprint       keys.Fingerprint
	StoredState       State
	StoredAt          time.Time
}

func (e *FingerprintMismatchError) Error() string {
	return fmt.Sprintf("oncekit/ledger: key %q in %s was first used at %s with another payload (%s, now %s): a retry must send the same payload; a new intent needs a new key",
		e.Key, e.Scope, e.StoredAt.UTC().Format(time.RFC3339), e.StoredFingerprint, e.Fingerprint)
}

// Is matches [ErrFingerprintMismatch].
func (e *FingerprintMismatchError) Is(target error) bool { return target == ErrFingerprintMismatch }

// InProgressError reports that another attempt holds the key. It is retryable.
type InProgressError struct {
	Scope keys.Scope
	Key   keys.Key
	// LeaseUntil is when the other attempt's lease runs out (a claim of Claim), or
	// zero for an uncommitted local transaction. A time already past means the claim's
	// holder may have made its call and not recorded it: Do and DoStatement do not take
	// such a key over; Claim does, and makes the call again with the same downstream key.
	LeaseUntil time.Time
	// Waited is how long this call waited for the other attempt.
	Waited time.Duration
}

func (e *InProgressError) Error() string {
	s := fmt.Sprintf("oncekit/ledger: key %q in %s is held by another attempt", e.Key, e.Scope)
	if e.Waited > 0 {
		s += fmt.Sprintf(" (waited %s)", e.Waited.Round(time.Millisecond))
	}
	if !e.LeaseUntil.IsZero() {
		// A claim of Claim: Do and DoStatement wait for it while its lease is live, and
		// never take it over once it ran out; Claim does, with the same downstream key.
		return s + fmt.Sprintf(" under a claim of Claim whose lease runs out at %s: retry later; once the lease has run out, only Claim takes the key over",
			e.LeaseUntil.UTC().Format(time.RFC3339Nano))
	}
	return s + ": retry later, and the retry will replay its result"
}

// Is matches [ErrInProgress].
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// LeaseLostError reports that a claim can no longer be completed, failed or released by
// its holder: its lease ran out and another attempt took the key over, or the record
// was finished already. The holder must not report its outcome as the key's result.
type LeaseLostError struct {
	Scope keys.Scope
	Key   keys.Key
	// Current is the record as it is now, or nil if there is none.
	Current *Record
}

func (e *LeaseLostError) Error() string {
	state := "gone"
	if e.Current != nil {
		state = string(e.Current.State)
	}
	return fmt.Sprintf("oncekit/ledger: the claim on key %q in %s is no longer owned by this attempt (record is %s): another attempt took it over after the lease ran out",
		e.Key, e.Scope, state)
}

// Is matches [ErrLeaseLost].
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// BodyTooLargeError reports a result body over [Config].MaxBodyBytes. Nothing was stored
// and the mutation was rolled back.
type BodyTooLargeError struct {
	Size  int
	Limit int
}

func (e *BodyTooLargeError) Error() string {
	return fmt.Sprintf("oncekit/ledger: result body is %d bytes, over the limit of %d: store a reference to large results, or raise Config.MaxBodyBytes", e.Size, e.Limit)
}

// Is matches [ErrBodyTooLarge].
func (e *BodyTooLargeError) Is(target error) bool { return target == ErrBodyTooLarge }

// DefinitiveError is a business failure that must not be retried into a different
// outcome, such as a declined card. A function that returns one (directly or wrapped)
// has its writes rolled back, the failure stored, and every retry of the key receives
// the same failure with Replayed set. Any other error rolls back and leaves the key free.
type DefinitiveError struct {
	// Code is a stable, machine-readable reason, such as "card_declined".
	Code string
	// Message is for people.
	Message string
	// Response, when set, is the failure's own answer, stored with it and replayed byte
	// for byte: an HTTP error's status and body, say. Its Body counts against
	// [Config].MaxBodyBytes, as a completed record's does. Nil stores none.
	Response *Response
	// Replayed is true when the failure was read from the ledger.
	Replayed bool
}

// Definitive returns a [*DefinitiveError] with code and message.
func Definitive(code, message string) *DefinitiveError {
	return &DefinitiveError{Code: code, Message: message}
}

func (e *DefinitiveError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// NotAppliedError marks an error after which an external call certainly had no effect
// (the provider refused the request before doing anything); [NotApplied] makes one.
// Package activity's External and package agent's tool calls release the claim on it,
// so a retry makes the call afresh, rather than keep the claim as one that may have
// acted.
type NotAppliedError struct{ Err error }

func (e *NotAppliedError) Error() string { return e.Err.Error() }
func (e *NotAppliedError) Unwrap() error { return e.Err }

// NotApplied wraps err in a [*NotAppliedError], or returns nil for a nil err.
func NotApplied(err error) error {
	if err == nil {
		return nil
	}
	return &NotAppliedError{Err: err}
}

// ErrSnapshotConflict: the key was completed by a transaction that committed after the
// caller's REPEATABLE READ or SERIALIZABLE snapshot was taken, so its result cannot be
// read, and must not be written again, inside that snapshot.
var ErrSnapshotConflict = errors.New("oncekit/ledger: the key was completed after this transaction's snapshot")

// SnapshotConflictError reports [ErrSnapshotConflict] from [Ledger.DoTx]. Everything
// DoTx did in the caller's transaction has been undone and the transaction is usable,
// but the intent cannot be decided inside it: roll the whole transaction back and
// retry it, and the retry replays the stored result. Like a serialization failure, its
// SQLState is 40001, so retry loops that look for that code retry it.
type SnapshotConflictError struct {
	Scope keys.Scope
	Key   keys.Key
}

func (e *SnapshotConflictError) Error() string {
	return fmt.Sprintf("oncekit/ledger: key %s in %s was completed by a transaction that committed after this transaction's snapshot: roll back and retry the transaction, and the retry will replay the result",
		quoteKey(e.Key), e.Scope)
}

// Is matches [ErrSnapshotConflict].
func (e *SnapshotConflictError) Is(target error) bool { return target == ErrSnapshotConflict }

// SQLState returns "40001" (serialization_failure).
func (e *SnapshotConflictError) SQLState() string { return pgsql.SerializationFailure }

// ErrInvalidResponse: a response the ledger cannot store as it is.
var ErrInvalidResponse = errors.New("oncekit/ledger: invalid response")

// InvalidResponseError reports a [Response] field that PostgreSQL cannot store, such as
// a ResourceRef with a NUL byte or invalid UTF-8. Nothing was stored and the mutation
// was rolled back.
type InvalidResponseError struct {
	// Field names the field: "ResourceRef".
	Field string
	// Offset is the byte offset of the first byte that cannot be stored.
	Offset int
}

func (e *InvalidResponseError) Error() string {
	return fmt.Sprintf("oncekit/ledger: Response.%s has a NUL byte or invalid UTF-8 at offset %d: store text only", e.Field, e.Offset)
}

// Is matches [ErrInvalidResponse].
func (e *InvalidResponseError) Is(target error) bool { return target == ErrInvalidResponse }

// quoteKey quotes a key for an error message, cut to its first 64 bytes: an error never
// echoes a whole key.
func quoteKey(k keys.Key) string {
	const limit = 64
	if len(k) <= limit {
		return strconv.Quote(string(k))
	}
	return strconv.Quote(string(k[:limit])) + fmt.Sprintf("… (%d bytes)", len(k))
}

// OutcomeUnknownError reports that a call sent a commit and did not hear whether it
// committed: the connection broke or was cut, PostgreSQL ended it with a FATAL error (a
// backend terminated, a server shut down, which may happen after the commit became
// durable), or the call's context ended while the answer was awaited. PostgreSQL may
// have committed, before or after the call returned. [Ledger.Do] returns it for the
// commit of its own transaction; [Ledger.Claim], [Ledger.Complete], [Ledger.Fail],
// [Ledger.Release], [Ledger.MarkUncertain] and [Ledger.Extend] for their statement,
// which commits by itself. Their Tx forms never return it: the caller's commit decides.
//
// It is retryable, and never means "rolled back". A later call of Do with the same key
// replays the result if the commit happened, and runs fn as a first execution if it did
// not, so the intent still takes effect once. After Claim, call Claim again with
// ClaimOpts.Token set to Token: it resumes the lease if the claim committed. After
// Complete, Fail or MarkUncertain, Claim the key again: it replays what was stored, or
// takes the key over when the finish did not commit.
type OutcomeUnknownError struct {
	Scope keys.Scope
	Key   keys.Key
	// Token is the owner token the lost statement was sent with: for Claim, the token
	// of the claim that may have committed; for a finish, the lease's.
	Token uuid.UUID
	// Err is what the commit met.
	Err error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("oncekit/ledger: the commit of key %q in %s was sent and its answer was lost (%v): the outcome is unknown, not rolled back; call again with the same key, which replays the result if it committed", e.Key, e.Scope, e.Err)
}

// Unwrap returns the error the commit met.
func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// Is matches [ErrOutcomeUnknown].
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

package ledger

import (
	"errors"
	"fmt"
	"time"

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
	// ErrNilFunc: a nil function was passed to run.
	ErrNilFunc = errors.New("oncekit/ledger: nil function: pass the mutation to run")
	// ErrManagedTx: the function tried to commit or roll back the ledger's transaction.
	ErrManagedTx = errors.New("oncekit/ledger: the ledger commits and rolls back its own transaction: return a result or an error instead")
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
	// LeaseUntil is when the other attempt's lease runs out (external-effect mode), or
	// zero for an uncommitted local transaction.
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
		s += fmt.Sprintf(" until %s", e.LeaseUntil.UTC().Format(time.RFC3339Nano))
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

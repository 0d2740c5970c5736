package ledger

import (
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/keys"
)

// State is the state of a record.
type State string

// The states of a record.
const (
	// StatePending: an attempt owns the key. A call of Do never commits this state (its
	// record commits with the result); a claim of [Ledger.Claim] commits it with a
	// lease.
	StatePending State = "pending"
	// StateCompleted: the result is stored and every retry replays it.
	StateCompleted State = "completed"
	// StateFailed: a definitive failure is stored and every retry replays it.
	StateFailed State = "failed"
)

// Response is what an execution produced and what a replay returns, byte for byte.
type Response struct {
	// Code is an application status code, such as an HTTP status; 0 when unused.
	Code int
	// Body is the stored result.
	Body []byte
	// ResourceRef optionally names what the execution created, such as "order/42" or a
	// provider's charge ID.
	ResourceRef string
}

// Result is the outcome of a ledger call.
type Result struct {
	Response
	// Replayed is true when the result was read from the ledger and nothing ran.
	Replayed bool
	// Attempts counts the attempts that owned the key (a claim of Claim).
	Attempts int
	// CreatedAt is when the intent was first recorded, to the microsecond: by the clock of
	// the process whose Do or DoTx ran it (Config.Test.NowFunc when set), taken as fn
	// returned; for Claim, by the database's clock. Replays return the same time.
	CreatedAt time.Time
}

// Record is one row of the ledger.
type Record struct {
	Scope       keys.Scope
	Key         keys.Key
	Fingerprint keys.Fingerprint
	State       State
	Response    Response
	// ErrorCode and ErrorMessage hold a stored definitive failure (StateFailed).
	ErrorCode    string
	ErrorMessage string
	// OwnerToken and LeaseUntil are set while an external-effect claim is pending.
	OwnerToken uuid.UUID
	LeaseUntil time.Time
	// Uncertain is set when an attempt reported that its external call may have happened.
	Uncertain bool
	Attempts  int
	// CreatedAt says when, as Result.CreatedAt does: a record written by Do or DoTx
	// holds the clock of the process that wrote it. Such a record expires its retention
	// after that time, or after its transaction began by the database's clock if that is
	// later, so a process whose clock is behind cannot make it expire early. UpdatedAt
	// is when the record was last written, and LeaseUntil when its lease ends, both by
	// the database's clock (or Config.Test.NowFunc).
	CreatedAt time.Time
	UpdatedAt time.Time
	ExpiresAt time.Time
	// Expired reports whether the record had expired when it was read (by the database's
	// clock); an expired record counts as absent.
	Expired bool
	// LeaseExpired reports whether a pending record's lease had run out when it was read.
	LeaseExpired bool
	// Origin is where the intent came from, as the attempt that first wrote the record
	// had it in its context ([WithOrigin]). Operators' reads ([Ledger.Get], [Ledger.List])
	// fill it in; it is zero for a record written without one, or before the ledger's
	// migration 004.
	Origin Origin
}

func (r *Record) result(replayed bool) Result {
	return Result{Response: r.Response, Replayed: replayed, Attempts: r.Attempts, CreatedAt: r.CreatedAt}
}

// storedError returns the definitive failure of a failed record.
func (r *Record) storedError(replayed bool) *DefinitiveError {
	derr := &DefinitiveError{Code: r.ErrorCode, Message: r.ErrorMessage, Replayed: replayed}
	if r.Response.Code != 0 || r.Response.Body != nil {
		resp := r.Response
		derr.Response = &resp
	}
	return derr
}

// Package sagarec is the protocol package saga's workflow code speaks with the
// activities that record a saga in the ledger (package activity implements them, and
// package testsuite keeps them in memory): the activities' names and their inputs and
// outputs. It is internal: users call saga.Run, and never these activities.
package sagarec

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// Names of the activities that record a saga in the ledger. Workers register them
// (oncekit's worker plugin and the testsuite environments do; see activity.RegisterSaga).
const (
	// ActivityBegin claims the saga's key, or returns the outcome recorded under it. Run
	// calls it first as a local activity, which answers at once; when another run holds
	// the key, Run calls it again as an activity, which waits for that run.
	ActivityBegin = "oncekit.saga.Begin"
	// ActivityHold renews the run's claim on the saga's key and says what the key holds:
	// still this run's, ended (with its outcome), taken over by another run, or
	// compensating. A local activity, run before each step and each compensation, and
	// every third of the lease while the saga runs.
	ActivityHold = "oncekit.saga.Hold"
	// ActivityCompensating records, before the first compensation runs, that the saga is
	// compensating, why, and which steps it had registered. A local activity.
	ActivityCompensating = "oncekit.saga.Compensating"
	// ActivityEnd records the saga's outcome under its key.
	ActivityEnd = "oncekit.saga.End"
	// CompensatingPurpose derives, from the saga's key, the key under which
	// [ActivityCompensating] records that the saga is compensating.
	CompensatingPurpose = "compensating"
)

// BeginRequest is the input of [ActivityBegin] and [ActivityHold].
type BeginRequest struct {
	// Key is the saga's key (a keys.Key).
	Key string `json:"key"`
	// Token identifies the run that owns the key; the run's retried activities present
	// the same token and resume its claim.
	Token uuid.UUID     `json:"token"`
	Lease time.Duration `json:"lease"`
	// Fingerprint is the fingerprint of the saga's request (a keys.Fingerprint).
	Fingerprint string `json:"fingerprint"`
}

// Recorded is what the saga's key holds: the output of the record activities, and the
// outcome [ActivityEnd] records.
type Recorded struct {
	// Ended is true when the saga's outcome is recorded (Begin, Hold, End), or being
	// recorded (the input of End).
	Ended bool `json:"ended"`
	// Result is the saga's result as JSON, when it completed.
	Result json.RawMessage `json:"result,omitempty"`
	// ErrType and ErrMessage describe how it failed, when it did: the type and message
	// of the ApplicationError the saga ended with. Its cause is the one Compensating
	// records.
	ErrType    string `json:"err_type,omitempty"`
	ErrMessage string `json:"err_message,omitempty"`
	// Held is true when another run holds the key (Begin as a local activity, Hold): this
	// run waits for it with [ActivityBegin] and returns its outcome.
	Held bool `json:"held,omitempty"`
	// Compensating is set when the saga began compensating and has not ended (Begin,
	// Hold, Compensating, End): every run of it then compensates. Beside a recorded
	// failure (Ended with ErrType), it is the record the saga compensated under, whose
	// cause the replayed error carries.
	Compensating *Compensating `json:"compensating,omitempty"`
}

// Compensating is what a saga records when it begins to compensate: why, and which
// steps it had registered, in order. A run that takes the saga over, or a reset run,
// finds it and compensates too, instead of running the saga forward over money that is
// partly given back.
type Compensating struct {
	// ErrType and ErrMessage are the failure's type (of the first ApplicationError in
	// its chain) and text, for people and for runs that recorded no Cause.
	ErrType    string `json:"err_type,omitempty"`
	ErrMessage string `json:"err_message"`
	// Cause is the failure as Temporal encodes one (a failure.v1.Failure in protojson),
	// from which a later run rebuilds the same error. Empty for a saga compensated
	// without a cause, or a cause too large to record.
	Cause json.RawMessage `json:"cause,omitempty"`
	Steps []string        `json:"steps"`
}

// CompensatingRequest is the input of [ActivityCompensating].
type CompensatingRequest struct {
	BeginRequest
	Compensating Compensating `json:"compensating"`
}

// EndRequest is the input of [ActivityEnd].
type EndRequest struct {
	BeginRequest
	Outcome Recorded `json:"outcome"`
}

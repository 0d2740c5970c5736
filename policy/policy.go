// Package policy holds what workflow code and workers agree on about oncekit's errors:
// the Temporal ApplicationError types oncekit activities return, and retry defaults that
// do not retry the errors a retry cannot fix.
//
// It is deterministic and imports neither pgx nor the ledger, so workflow code can use
// it. Package activity re-exports the constants.
package policy

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// ApplicationError types returned by oncekit activities.
const (
	// ErrTypeKeyReused: the activity's key was used before with a different payload.
	// Not retryable: the same request will be refused again.
	ErrTypeKeyReused = "oncekit.KeyReusedWithDifferentPayload"
	// ErrTypeInProgress: another attempt holds the key. Retryable: a later attempt
	// replays the other's result.
	ErrTypeInProgress = "oncekit.InProgress"
	// ErrTypeInvalid: the activity's key, scope or result is invalid (for example a
	// result over the size limit). Not retryable.
	ErrTypeInvalid = "oncekit.Invalid"
	// ErrTypeLeaseLost: an external-effect attempt lost its claim to a newer attempt.
	// Retryable: the retry replays the newer attempt's result.
	ErrTypeLeaseLost = "oncekit.LeaseLost"
)

// NonRetryableErrorTypes lists the oncekit error types that no retry can fix. A stored
// definitive failure is returned as a non-retryable ApplicationError whose type is its
// business code, so it needs no entry here.
func NonRetryableErrorTypes() []string {
	return []string{ErrTypeKeyReused, ErrTypeInvalid}
}

// Defaults of the retry policy.
const (
	InitialIntervalDefault = time.Second
	BackoffDefault         = 2.0
	MaxIntervalDefault     = time.Minute
)

// RetryPolicy returns Temporal's usual exponential retry, unlimited attempts, that does
// not retry [NonRetryableErrorTypes] nor the extra types given.
func RetryPolicy(extraNonRetryable ...string) *temporal.RetryPolicy {
	return &temporal.RetryPolicy{
		InitialInterval:        InitialIntervalDefault,
		BackoffCoefficient:     BackoffDefault,
		MaximumInterval:        MaxIntervalDefault,
		NonRetryableErrorTypes: append(NonRetryableErrorTypes(), extraNonRetryable...),
	}
}

// ActivityOptions returns activity options with startToClose as the StartToCloseTimeout
// and [RetryPolicy]. A guarded activity's lease lasts until its attempt's deadline, so
// startToClose also bounds how long a crashed attempt holds its key.
func ActivityOptions(startToClose time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: startToClose, RetryPolicy: RetryPolicy()}
}

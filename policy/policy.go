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
	// ErrTypeOutcomeUnknown: the activity's commit was sent and its answer was lost, so
	// its effect may have committed. Retryable: the retry replays the result if it did,
	// and runs the activity's effect once if it did not. Never a rollback.
	ErrTypeOutcomeUnknown = "oncekit.OutcomeUnknown"
	// ErrTypeCompensated: a saga's step failed and every compensation succeeded; the
	// saga ended with this error. Not retryable.
	ErrTypeCompensated = "oncekit.saga.Compensated"
	// ErrTypeCompensationFailed: a saga's step failed and at least one compensation
	// failed too; an operator must look. Not retryable.
	ErrTypeCompensationFailed = "oncekit.saga.CompensationFailed"
	// ErrTypeContinueAsNewRefused: a saga's function returned workflow.NewContinueAsNewError.
	// The saga compensates with this cause and ends compensated; continue as new after
	// saga.Run returns instead. Not retryable.
	ErrTypeContinueAsNewRefused = "oncekit.saga.ContinueAsNewRefused"
	// ErrTypePluginMissing: the worker that runs the workflow cannot record sagas, because
	// the activities of package saga are not registered on it: add oncekit's plugin
	// (worker.NewPlugin) to the client's or the worker's Options.Plugins. Not retryable.
	ErrTypePluginMissing = "oncekit.PluginMissing"
	// ErrTypeWorkerCrashed: a crash injected by a test's fault plan (package testsuite).
	// Retryable, as the loss of a worker is.
	ErrTypeWorkerCrashed = "oncekit.testsuite.WorkerCrashed"
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

// Defaults of the saga policies.
const (
	// StepMaxAttemptsDefault bounds the attempts of a saga step: about two minutes of
	// backoff (1 s doubling to the 1 min cap), after which the step counts as failed and
	// the saga compensates, so a customer gets an answer instead of a workflow that
	// retries forever.
	StepMaxAttemptsDefault = 8
	// CompensationDeadlineDefault bounds how long a compensation keeps retrying (its
	// ScheduleToCloseTimeout): long enough to outlive any outage of the database or a
	// provider, short enough that a compensation that can never succeed ends the
	// workflow with an error an operator sees.
	CompensationDeadlineDefault = 24 * time.Hour
)

// StepRetryPolicy returns [RetryPolicy] bounded to [StepMaxAttemptsDefault] attempts:
// the policy of a saga's forward steps. A step that keeps failing with a retryable error
// then fails, and the saga compensates.
func StepRetryPolicy(extraNonRetryable ...string) *temporal.RetryPolicy {
	p := RetryPolicy(extraNonRetryable...)
	p.MaximumAttempts = StepMaxAttemptsDefault
	return p
}

// CompensationRetryPolicy returns [RetryPolicy], unlimited attempts with backoff capped
// at [MaxIntervalDefault]: the policy of compensations, which must outlive an outage
// rather than give up after a few refused connections. Bound them by time instead, with
// a ScheduleToCloseTimeout such as [CompensationDeadlineDefault] (see
// [CompensationOptions]). Steps and compensations differ on purpose: a step that gives up
// is compensated, a compensation that gives up leaves money or stock out of balance.
func CompensationRetryPolicy(extraNonRetryable ...string) *temporal.RetryPolicy {
	return RetryPolicy(extraNonRetryable...)
}

// StepOptions returns the activity options of a saga step: startToClose per attempt
// and [StepRetryPolicy].
func StepOptions(startToClose time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: startToClose, RetryPolicy: StepRetryPolicy()}
}

// CompensationOptions returns the activity options of a compensation: startToClose per
// attempt, [CompensationRetryPolicy], and [CompensationDeadlineDefault] as the
// ScheduleToCloseTimeout over all attempts.
func CompensationOptions(startToClose time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: startToClose, ScheduleToCloseTimeout: CompensationDeadlineDefault,
		RetryPolicy: CompensationRetryPolicy()}
}

// ActivityOptions returns activity options with startToClose as the StartToCloseTimeout
// and [RetryPolicy]. A guarded activity's lease lasts until its attempt's deadline, so
// startToClose also bounds how long a crashed attempt holds its key.
func ActivityOptions(startToClose time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: startToClose, RetryPolicy: RetryPolicy()}
}

// Package activity runs a Temporal activity's side effect exactly once, under the
// oncekit ledger.
//
// # Local side effects
//
// [Do] runs a mutation of your own PostgreSQL database in the ledger's transaction, keyed
// by the activity's identity: run ID + activity ID by default ([keys.RunScoped]), the
// workflow ID ([keys.WorkflowScoped]) or a business key ([Opts].Key) when asked. When a
// worker dies after the mutation committed but before Temporal heard of it, the retried
// attempt replays the stored result instead of running the mutation again.
//
// # External side effects
//
// [External] guards a call outside the database, such as a payment API. It claims the
// key with a lease that lasts until the attempt's deadline, hands your function a
// [Call] whose DownstreamKey (derived from the activity's key) you send as the
// provider's idempotency key, and stores the outcome. A retry after a crash re-drives the
// call with the same downstream key; a retry after completion returns the stored result
// without calling.
//
// [DoErr] and [ExternalErr] are the same for activities that return only an error.
//
// # Saga compensations
//
// A compensation reads the record of the step it undoes with [StepResult]: the step's
// stored result when it completed, or that it never ran, failed definitively, or is still
// pending; it finds the step by the operation the step ran under, whether the step named
// its activity by registered name or by function. [RegisterSaga] registers the
// activities package saga records sagas with.
//
// # Errors
//
// Ledger outcomes become Temporal errors that retry policies can act on: a key reused
// with another payload is a non-retryable ApplicationError of type
// [policy.ErrTypeKeyReused]; another attempt in flight is a retryable
// [policy.ErrTypeInProgress]; a definitive business failure ([Definitive]) is
// non-retryable, typed by its code, and replayed identically on every retry. Workflow
// code finds these error types, and retry policies that skip the non-retryable ones, in
// package policy, which imports neither pgx nor the ledger.
//
// This package shares its name with Temporal's go.temporal.io/sdk/activity. A file that
// needs both imports Temporal's as tactivity:
//
//	import tactivity "go.temporal.io/sdk/activity"
package activity

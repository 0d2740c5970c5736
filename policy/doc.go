// Package policy holds what workflow code and workers agree on about oncekit's errors:
// the Temporal ApplicationError types oncekit activities return, and retry defaults that
// do not retry the errors a retry cannot fix.
//
// Which policy where:
//
//   - a plain guarded activity: [ActivityOptions], [RetryPolicy] (unlimited attempts; a
//     retry of a guarded activity is safe and replays);
//   - a saga's forward step: [StepOptions], [StepRetryPolicy] (bounded, so a step that
//     keeps failing ends in compensation);
//   - a compensation: [CompensationOptions], [CompensationRetryPolicy] (bounded by a long
//     deadline, not by attempts, so it outlives an outage).
//
// It is deterministic and imports neither pgx nor the ledger, so workflow code can use
// it. The error types are declared here alone: package activity returns them, and
// workflow code compares an ApplicationError's type against these constants.
package policy

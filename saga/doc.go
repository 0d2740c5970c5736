// Package saga runs a sequence of activities in workflow code, each with a compensation
// that undoes it, compensates exactly once when a later step fails, and remembers how the
// saga ended.
//
// # Running a saga
//
// [Run] runs a function of steps ([Saga.Do]) as the saga keyed by [Opts].Key. When the
// function returns an error, Run compensates and ends with a non-retryable
// ApplicationError of type [policy.ErrTypeCompensated] (or [policy.ErrTypeCompensationFailed]) whose
// message lists each compensation's outcome and whose cause is the failure that started
// it. [RunErr] is the same for a workflow that returns only an error.
//
// # What a saga key means across runs
//
// Run records the outcome under the saga's key: the result when the saga completed, the
// error when it compensated. Every later run with that key, in the same workflow or
// another, runs no step and returns the recorded outcome: the same result, or an
// ApplicationError of the same type and text. A run that finds the key held by a run in
// flight waits for it and then returns its outcome; if the holder's lease
// ([Opts].Lease, by default the workflow's execution timeout or [LeaseDefault]) runs
// out first, the waiting run takes the saga over and its steps replay what the first run
// did. The same key with another [Opts].Request is refused with
// [policy.ErrTypeKeyReused].
//
// A business key (keys.Business("transfer", id)) therefore holds across resets,
// continue-as-new and new workflows; to run a compensated transfer again, give the new
// attempt a new key. The default key comes from the workflow ID and the run's original
// run ID: a reset run presents the same identity and resumes (or replays) the saga of the
// run it was reset from, while each continue-as-new run and each retry of the whole
// workflow starts a saga of its own.
//
// The outcome is claimed and recorded through the activities [ActivityBegin] and
// [ActivityEnd] on the ledger (registered by the worker plugin and the testsuite environments,
// or by activity.RegisterSaga), so workflow code stays free of pgx. They retry like
// compensations, so an outage delays the record instead of losing it.
//
// # Steps
//
// [Saga.Do] registers a step's compensation before it runs the step's activity, so a
// step whose outcome is unknown (it timed out, its worker was lost) is compensated too.
// Every compensation must therefore tolerate "nothing to undo": it reads its step's
// record with activity.StepResult (the step's result when it completed; not run, failed or
// pending otherwise) and returns early when there is nothing to undo. A step whose context
// carries no retry policy gets [StepOptionsDefault]'s bounded one, so a step that keeps
// failing ends in compensation instead of retrying forever.
//
// # Keys
//
// Each step has a key derived from the saga's key and the step's name, and each
// compensation a key derived from its step's key ([keys.Derive] with purpose
// "compensate"). The keys travel to the activities in their headers
// ([keys.KeyContextKey], and [keys.StepContextKey] for the step a compensation undoes),
// where package activity uses them: a refund runs once even if its activity is retried,
// the workflow task is replayed, or compensation is started twice.
//
// # Compensation
//
// [Saga.Compensate] runs the compensations in reverse order, or all at once with
// [Opts].Parallel, on a disconnected context, so a cancelled workflow still
// compensates. It continues past a failing compensation and returns one
// [*CompensationError] listing every compensation's outcome. Compensations retry without
// an attempt limit under a 24-hour deadline ([CompensationOptionsDefault]): the opposite
// of steps on purpose, because a step that gives up is compensated, while a compensation
// that gives up leaves money or stock out of balance. Only a non-retryable error or the
// deadline ends one, and the saga then ends with [policy.ErrTypeCompensationFailed].
//
// The package is deterministic and imports neither pgx nor the ledger.
package saga

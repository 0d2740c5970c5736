// Package saga runs a sequence of activities in workflow code, each with a compensation
// that undoes it, and compensates exactly once when a later step fails.
//
// # Steps
//
// [Saga.Do] registers a step's compensation before it runs the step's activity, so a
// step whose outcome is unknown (it timed out, its worker was lost) is compensated too.
// Every compensation must therefore tolerate "nothing to undo".
//
// # Keys
//
// Each step has a key derived from the saga's key and the step's name, and each
// compensation a key derived from its step's key ([keys.Derive] with purpose
// "compensate"). The keys travel to the activities in their headers
// ([keys.KeyContextKey]), where package activity uses them: a refund runs once even if
// its activity is retried, the workflow task is replayed, or compensation is started
// twice. With the saga's key set to a business key (an order ID), a second workflow for
// the same order replays the first one's steps instead of repeating them.
//
// # Compensation
//
// [Saga.Compensate] runs the compensations in reverse order, or all at once with
// [Options].Parallel, on a disconnected context, so a cancelled workflow still
// compensates. It continues past a failing compensation and returns one
// [*CompensationError] listing every compensation's outcome. Compensations run under
// their own bounded retry policy, so one that keeps failing ends the workflow with a
// visible error instead of leaving it running forever.
//
// The package is deterministic and imports neither pgx nor the ledger.
package saga

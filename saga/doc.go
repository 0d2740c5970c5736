// Package saga runs a sequence of activities in workflow code, each with a compensation
// that undoes it, compensates exactly once when a later step fails, and remembers how the
// saga ended, so that what its key says, what the workflow returns and what the steps did
// to the money always agree.
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
// ApplicationError of the same type and message whose cause is the failure that started
// the compensation (rebuilt from its record, so errors.As finds it). A run that finds the
// key held by a run in flight waits for it and then returns its outcome; so does a run
// started in another coroutine of the same workflow while a run with the key is in
// flight there. A saga's function must not run the saga of its own key: that run would
// wait for itself, and is refused with [policy.ErrTypeInvalid]. The same key with another
// [Opts].Request is refused with [policy.ErrTypeKeyReused].
//
// A business key (from keys.Business("transfer", id)) therefore holds across resets,
// continue-as-new and new workflows; to run a compensated transfer again, give the new
// attempt a new key. The default key comes from the workflow ID and the run's original
// run ID: a reset run presents the same identity and resumes (or replays) the saga of the
// run it was reset from, while each continue-as-new run and each retry of the whole
// workflow starts a saga of its own.
//
// # A live saga keeps its key
//
// A run owns its saga's key under a lease ([Opts].Lease, by default the workflow's
// execution timeout or [LeaseDefault]) and renews it while it runs: before each step and
// each compensation, and every third of the lease in between, so a step or a compensation
// that retries through an outage for hours keeps the key however short the lease. A
// second run with the key waits for the first as long as the first renews it.
//
// A run is presumed dead once it has not renewed its lease for a whole lease: its
// workflow was terminated or timed out, or no worker ran it for that long. The next run
// with the key (a resubmission) then takes the saga over. It never runs the saga forward
// over money that is partly given back: if the dead run had begun compensating (it
// records that, with the cause and the steps registered, before its first compensation),
// the taker replays the steps that run had finished, compensates every one, and records
// the saga as compensated with the dead run's cause. Otherwise the taker runs the saga
// function, whose steps replay what the dead run recorded, and the saga goes on from
// there. A presumed-dead run that wakes up finds another run's claim at its next step or
// compensation, runs nothing more, waits for that run and returns its outcome. Choose a
// lease longer than any stretch in which no worker may run the workflow (a deployment, an
// outage of the workers): a lease that runs out under a run that is only delayed hands
// the saga to another run while a step of the first may still be in flight.
//
// # Resets
//
// A reset of a saga that has ended replays its recorded outcome; it never runs the saga
// again. A run asks the key before each step and each compensation, through a local
// activity whose answer is recorded in the same workflow task as the step's command, so
// wherever a reset goes back to, the reset run asks before it schedules anything, finds
// the outcome, runs no step nor compensation, and returns the outcome: the recorded
// result when the saga completed, its error when it compensated, whatever the steps would
// do now. The money stays as the first run left it, which is what the key says. (Code of
// the saga function that is not a step, such as a plain activity between two steps, runs
// again as any reset would run it.) To run a transfer again after a reset, start it with
// a new key.
//
// A reset of a saga still running (the reset run resumes it, with the same token) goes on
// from the reset point, its steps replaying what was recorded; if the run it was reset
// from had begun compensating, the reset run compensates too.
//
// # Continue-as-new
//
// A saga function must not continue as new: the new run would find the saga recorded as
// this run ends it. Run refuses a [workflow.ContinueAsNewError] from the function: it
// compensates the steps registered so far, with a cause of type
// [policy.ErrTypeContinueAsNewRefused], and the workflow ends compensated instead of
// continuing. Continue as new after Run returns: with the same key, the new run replays
// the outcome; with a new key, it runs a new saga.
//
// # Recording
//
// The saga is recorded through four activities on the ledger: oncekit.saga.Begin,
// oncekit.saga.Hold, oncekit.saga.Compensating and oncekit.saga.End, registered by the worker
// plugin and the testsuite environments (or by activity.RegisterSaga), so workflow code
// stays free of pgx. All but End run as local activities, in the workflow's own tasks;
// they retry like compensations, so an outage of the database delays the saga instead of
// losing its record. A worker without them fails the workflow at once with
// [policy.ErrTypePluginMissing], whose message names the plugin. A unit test on Temporal's
// own test environment, with mocked activities, registers in-memory stand-ins with
// testsuite.RegisterSagaInMemory.
//
// # A saga cut short
//
// Two ways out of a workflow leave its saga unended, and say so by what they do not say.
// The first is PluginMissing in the middle of a saga: a saga begun on a worker with the
// plugin and carried on by one without it (a deployment that lost the plugin) fails as
// soon as that worker replays the workflow, with [policy.ErrTypePluginMissing] and not
// with [policy.ErrTypeCompensated]. PluginMissing means the saga did not end: that run
// compensates nothing and records no outcome, so the steps it had run stay done (a
// transfer may be half-moved), and the saga's key stays held until its lease lapses
// ([Opts].Lease; by default the workflow's execution timeout). The second is the
// workflow's execution timeout (or a termination) during a compensation: the workflow
// ends timed out, the compensations not yet run do not run, and nothing records
// [policy.ErrTypeCompensationFailed]; the key stays held the same way. In both cases the
// next run with the key after the lease lapses (a resubmission, on a worker with the
// plugin) takes the saga over, as it takes over any dead run: it finishes the saga, or,
// when the first run had begun compensating, finishes the compensations and records the
// saga as compensated. Resubmit such a workflow; give a saga an execution timeout long
// enough for its compensations, which retry for up to [policy.CompensationDeadlineDefault].
//
// Run's commands are versioned (workflow.GetVersion): a workflow whose history was
// written before runs held their keys replays as it was written.
//
// # Steps
//
// [Saga.Do] registers a step's compensation before it runs the step's activity, so a
// step whose outcome is unknown (it timed out, its worker was lost) is compensated too.
// Every compensation must therefore tolerate "nothing to undo": it reads its step's
// record with activity.StepResult (the step's result when it completed; not run, failed or
// pending otherwise) and returns early when there is nothing to undo. A step may name its
// activity by registered name or by function, as Temporal's samples do. A step whose
// context carries no retry policy gets [StepOptionsDefault]'s bounded one, so a step that
// keeps failing ends in compensation instead of retrying forever.
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
// Temporal's in-memory test environment stops "unlimited" attempts at 10, so there a
// compensation that keeps failing ends the saga CompensationFailed within the test; the
// error's message says so.
//
// The package is deterministic and imports neither pgx nor the ledger.
package saga

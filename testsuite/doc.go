// Package testsuite proves that activities have their side effects exactly once, by
// crashing them.
//
// # Fault injection in memory
//
// A [FaultPlan] lets an activity attempt run for real and then fails it at a
// [CrashPoint] as if the worker had died, so Temporal retries it: after its effect, its
// completion lost ([AfterEffect]); and inside activity.External, after the provider
// acted and before the ledger recorded it ([AfterCall]), or with the provider's answer
// lost ([LostAnswer]). [NewWorkflowEnvironment] returns Temporal's in-memory test workflow environment
// with the plan, the ledger and a tenant wired in. [RequireCount] and
// [RequireExactlyOnce] count effects in PostgreSQL, where they really are, rather than in
// Go variables.
//
// # Conformance
//
// [CheckCrashBeforeComplete] is the test to write for each of your activities: it runs
// the activity once per crash point it reaches, crashes the first attempt there, lets
// Temporal retry, and fails the test if the effect happened other than once, the retry's
// result differs from what the crashed attempt produced, or (with a recording
// [Provider]) the retry called the provider with another idempotency key.
// [RunCrashPoints] returns the [Report] of each point instead.
//
// # A real server and a killed worker
//
// [StartDevServer] gives a test a real Temporal server (TEMPORAL_ADDRESS, or a dev
// server from a cached CLI build). [StartWorkerProcess] runs a worker in a child
// process, re-executing the test binary, that the test can SIGKILL, stop or wait for;
// [RunWorkerProcess] is its entry point, called from TestMain.
//
// This package shares its name with Temporal's go.temporal.io/sdk/testsuite. A test that
// needs both imports Temporal's as ttestsuite:
//
//	import ttestsuite "go.temporal.io/sdk/testsuite"
package testsuite

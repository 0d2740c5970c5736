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
// # Sagas in unit tests
//
// A saga records itself through activities that oncekit's plugin registers. A unit test
// on Temporal's own test environment, with every activity mocked, calls
// [RegisterSagaInMemory] once, so that the saga keeps its records in memory and runs its
// steps; without it the workflow fails before any mock is called (and a test that only
// asserts an error passes without testing anything: assert the mocks were called with
// env.AssertExpectations). [NewWorkflowEnvironment] wires the real records on a ledger.
// Temporal's in-memory environment stops "unlimited" retries at 10 attempts, so a
// compensation that keeps failing there ends the saga CompensationFailed within the
// test, where a real server would retry for 24 hours.
//
// # Conformance
//
// [CheckCrashBeforeComplete] is the test to write for each of your activities: it runs
// the activity once per crash point it reaches, crashes the first attempt there, lets
// Temporal retry, and fails the test if the effect happened other than once, the retry's
// result differs from what the crashed attempt produced, or (with a recording
// [Provider]) the retry called the provider with another idempotency key. An
// activity.External call whose provider acted twice is told to send
// activity.Call.DownstreamKey, however its effects are counted.
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

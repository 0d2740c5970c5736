package testsuite

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/worker"
)

// TenantPrefix begins the tenant of test environments that name none. Each such
// environment gets a tenant of its own, TenantPrefix, a hyphen and 8 random hex digits
// (such as "test-3f9a1c2e"), because Temporal's in-memory environment gives every
// workflow the same run ID ("default-test-run-id"), and run-scoped keys of two
// environments on one ledger would otherwise collide: the second would replay the
// first one's results.
const TenantPrefix = "test"

// EnvConfig configures [NewWorkflowEnvironment]. A nil *EnvConfig means all defaults.
type EnvConfig struct {
	// Ledger is put in every activity's context, where package activity finds it.
	// Defaults to none, for workflows whose activities do not use oncekit; a guarded
	// activity then fails with a non-retryable error of type policy.ErrTypeInvalid
	// that says no ledger is configured.
	Ledger *ledger.Ledger
	// Tenant is every activity's tenant unless the workflow carries one (see
	// keys.WithTenant). Defaults to a tenant of this environment's own: [TenantPrefix],
	// a hyphen and 8 random hex digits, different for every call of
	// NewWorkflowEnvironment, so that environments sharing a ledger never replay each
	// other's records. Give two environments the same Tenant when the second should
	// replay what the first stored. A Tenant that keys.Scope refuses (longer than
	// keys.MaxScopeLen bytes, or with a byte outside printable ASCII) fails each guarded
	// activity with a non-retryable error of type policy.ErrTypeInvalid.
	Tenant string
	// Faults is the fault plan to carry out. Defaults to none.
	Faults *FaultPlan
	// MetricsHandler receives the metrics Temporal and package activity report through
	// the SDK's handler. Defaults to none.
	MetricsHandler client.MetricsHandler
}

// NewWorkflowEnvironment returns Temporal's in-memory test workflow environment with
// oncekit wired in as the worker plugin wires a real worker (the ledger and tenant in
// every activity's context, keys carried to activities, the activities of package saga)
// plus the tenant propagator and the fault plan. Register your workflows and activities
// on it as on any Temporal environment.
//
// Temporal's in-memory environment retries an activity whose retry policy has no attempt
// limit 10 times at most (a real server retries until the activity's deadline). A saga
// compensation that keeps failing, as during a simulated outage, therefore ends the saga
// CompensationFailed within the test, not after the compensations' 24-hour deadline, and
// the saga's error says so. Make a simulated outage shorter than 10 attempts.
func NewWorkflowEnvironment(opts *EnvConfig) *ttestsuite.TestWorkflowEnvironment {
	o := EnvConfig{}
	if opts != nil {
		o = *opts
	}
	if o.Tenant == "" {
		o.Tenant = TenantPrefix + "-" + uuid.NewString()[:8]
	}
	var s ttestsuite.WorkflowTestSuite
	s.SetLogger(devenv.QuietLogger())
	if o.MetricsHandler != nil {
		s.SetMetricsHandler(o.MetricsHandler)
	}
	env := s.NewTestWorkflowEnvironment()
	var ics []interceptor.WorkerInterceptor
	if o.Faults != nil {
		ics = append(ics, o.Faults.Interceptor())
	}
	ics = append(ics, worker.Interceptor(o.Ledger, o.Tenant))
	// A workflow task may take 10 s, not the SDK's 1 s, before it is reported as a
	// deadlock: tests run under the race detector, often on a busy machine.
	env.SetWorkerOptions(tworker.Options{Interceptors: ics, DeadlockDetectionTimeout: deadlockDetectionTimeout})
	activity.RegisterSaga(env)
	return env
}

// deadlockDetectionTimeout is how long a workflow task of a test environment may run
// before it is reported as a deadlock.
const deadlockDetectionTimeout = 10 * time.Second

// Querier runs a query: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Count runs a query returning one count, such as
// "SELECT count(*) FROM charges WHERE order_id = $1".
func Count(ctx context.Context, q Querier, sql string, args ...any) (int, error) {
	var n int
	err := q.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// RequireCount fails the test unless the counting query returns want.
func RequireCount(ctx context.Context, t testing.TB, q Querier, want int, sql string, args ...any) {
	t.Helper()
	n, err := Count(ctx, q, sql, args...)
	if err != nil {
		t.Fatalf("oncekit/testsuite: count effects: %v", err)
	}
	if n != want {
		t.Fatalf("oncekit/testsuite: %q counted %d effects, want %d", sql, n, want)
	}
}

// RequireExactlyOnce fails the test unless the counting query returns exactly 1: the
// effect happened, and happened once.
func RequireExactlyOnce(ctx context.Context, t testing.TB, q Querier, sql string, args ...any) {
	t.Helper()
	RequireCount(ctx, t, q, 1, sql, args...)
}

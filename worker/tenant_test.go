package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A workflow started by a plain Temporal client carries no tenant: its guarded activity
// runs under the worker's default tenant. With RequireTenant it fails, saying why.
func TestWorker_DefaultTenantWithPlainClient(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger()})
	require.NoError(t, err)
	defer c.Close()

	charge := func(ctx context.Context, amount int) (int, error) {
		return activity.Do(ctx, amount, func(ctx context.Context, tx pgx.Tx, call activity.Call, amount int) (int, error) {
			return amount, nil
		}, nil)
	}
	wf := func(ctx workflow.Context, amount int) (int, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
		var out int
		err := workflow.ExecuteActivity(ctx, "charge", amount).Get(ctx, &out)
		return out, err
	}
	for _, tc := range []struct {
		queue   string
		require bool
	}{{"default-tenant", false}, {"require-tenant", true}} {
		// The plugin on the worker alone; the client is Temporal's, untouched.
		plugin, err := worker.NewPlugin(worker.Config{Ledger: l, RequireTenant: tc.require})
		require.NoError(t, err)
		w := tworker.New(c, tc.queue, tworker.Options{Plugins: []tworker.Plugin{plugin}})
		w.RegisterWorkflowWithOptions(wf, workflow.RegisterOptions{Name: "pay"})
		w.RegisterActivityWithOptions(charge, tactivity.RegisterOptions{Name: "charge"})
		require.NoError(t, w.Start())
		defer w.Stop()
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: tc.queue, WorkflowExecutionTimeout: time.Minute}, "pay", 42)
		require.NoError(t, err)
		var out int
		err = run.Get(ctx, &out)
		if !tc.require {
			require.NoError(t, err)
			require.Equal(t, 42, out)
			testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM `+schema+`.idempotency_records WHERE tenant = $1`, worker.TenantDefault)
			continue
		}
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app)
		require.Equal(t, policy.ErrTypeInvalid, app.Type())
		require.Contains(t, err.Error(), "no tenant")
	}
}

package testsuite_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/workflowservice/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

type step struct {
	OrderID   string `json:"order_id"`
	Strategy  string `json:"strategy"` // "run", "workflow" or "business"
	Iteration int    `json:"iteration"`
}

func reserveStep(ctx context.Context, s step) (int64, error) {
	opts := &activity.Opts{}
	switch s.Strategy {
	case "workflow":
		opts.Strategy = keys.WorkflowScoped
	case "business":
		k, err := keys.Business(s.OrderID, "reserve")
		if err != nil {
			return 0, err
		}
		opts.Key = k
	}
	return activity.Do(ctx, s, func(ctx context.Context, tx pgx.Tx, _ activity.Call, s step) (int64, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id) VALUES ($1) RETURNING id`, s.OrderID).Scan(&id)
		return id, err
	}, opts)
}

func stepWorkflow(ctx workflow.Context, s step) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3}})
	if err := workflow.ExecuteActivity(ctx, "strategies.reserve", s).Get(ctx, nil); err != nil {
		return err
	}
	if s.Iteration == 0 && s.Strategy != "business" {
		s.Iteration = 1
		return workflow.NewContinueAsNewError(ctx, "strategies.can", s)
	}
	return nil
}

func onceWorkflow(ctx workflow.Context, s step) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3}})
	return workflow.ExecuteActivity(ctx, "strategies.reserve", s).Get(ctx, nil)
}

// setupServerWorker runs an in-process oncekit worker on the real server.
func setupServerWorker(t *testing.T) (client.Client, *pgxpool.Pool, string, string) {
	t.Helper()
	srv := testsuite.StartDevServer(t)
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, effectsSchema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	queue := "strategies-" + schema
	w := tworker.New(c, queue, tworker.Options{})
	w.RegisterWorkflowWithOptions(stepWorkflow, workflow.RegisterOptions{Name: "strategies.can"})
	w.RegisterWorkflowWithOptions(onceWorkflow, workflow.RegisterOptions{Name: "strategies.once"})
	w.RegisterActivityWithOptions(reserveStep, tactivity.RegisterOptions{Name: "strategies.reserve"})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return c, pool, queue, schema
}

// Continue-as-new starts a run that numbers its activities from the start again. The
// workflow-scoped key of the new run's first activity is the old run's: with another
// payload it is refused (with the same payload it would replay the old result). The
// run-scoped key keeps the runs apart.
func TestStrategies_ContinueAsNew(t *testing.T) {
	t.Parallel()
	c, pool, queue, schema := setupServerWorker(t)
	ctx := keys.WithTenant(context.Background(), "tenant-can")

	for _, tc := range []struct {
		strategy string
		failType string
		effects  int
	}{
		{"workflow", policy.ErrTypeKeyReused, 1},
		{"run", "", 2},
	} {
		order := "can-" + tc.strategy
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: order + "-" + uuid.NewString(), TaskQueue: queue,
			WorkflowExecutionTimeout: time.Minute}, "strategies.can", step{OrderID: order, Strategy: tc.strategy})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = c.GetWorkflow(wctx, run.GetID(), "").Get(wctx, nil) // follows the continue-as-new chain
		cancel()
		if tc.failType == "" {
			require.NoError(t, err)
		} else {
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr, tc.strategy)
			require.Equal(t, tc.failType, appErr.Type())
		}
		testsuite.RequireCount(t.Context(), t, pool, tc.effects, "SELECT count(*) FROM reservations WHERE order_id = $1", order)
	}
	// The tenant set on the client's context reached the activities.
	testsuite.RequireCount(t.Context(), t, pool, 3, "SELECT count(*) FROM "+pgx.Identifier{schema, "idempotency_records"}.Sanitize()+" WHERE tenant = 'tenant-can'")
}

// A reset replays the workflow under a new run ID: a run-scoped key changes and the
// effect runs again (the hazard of the default strategy); a business key is the same in
// the reset run and the effect is replayed from the ledger.
func TestStrategies_Reset(t *testing.T) {
	t.Parallel()
	c, pool, queue, _ := setupServerWorker(t)
	ctx := keys.WithTenant(context.Background(), "tenant-reset")
	for _, tc := range []struct {
		strategy string
		effects  int
	}{
		{"run", 2},
		{"business", 1},
	} {
		order := "reset-" + tc.strategy
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: order + "-" + uuid.NewString(), TaskQueue: queue,
			WorkflowExecutionTimeout: time.Minute}, "strategies.once", step{OrderID: order, Strategy: tc.strategy})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(t, run.Get(wctx, nil))
		resp, err := c.ResetWorkflowExecution(wctx, &workflowservice.ResetWorkflowExecutionRequest{
			Namespace:                 "default",
			WorkflowExecution:         &commonpb.WorkflowExecution{WorkflowId: run.GetID(), RunId: run.GetRunID()},
			Reason:                    "test: reset to the first workflow task",
			WorkflowTaskFinishEventId: 4, // started, task scheduled, started, completed
			RequestId:                 uuid.NewString(),
		})
		require.NoError(t, err)
		require.NoError(t, c.GetWorkflow(wctx, run.GetID(), resp.GetRunId()).Get(wctx, nil))
		cancel()
		testsuite.RequireCount(t.Context(), t, pool, tc.effects, "SELECT count(*) FROM reservations WHERE order_id = $1", order)
	}
}

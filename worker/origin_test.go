package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

// Under default keys (the run ID's, the saga's from the workflow ID and run ID), every
// record a workflow's activities and saga write carries the workflow's ID, its run's
// ID, its type and the activity's type: the workflow's records are found from its ID.
func TestInterceptor_RecordsCarryTheirOrigin(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)

	charge := func(ctx context.Context, amount int) (int, error) {
		return activity.Do(ctx, amount, func(ctx context.Context, tx pgx.Tx, call activity.Call, amount int) (int, error) {
			return amount, nil
		}, nil)
	}
	order := func(ctx workflow.Context, amount int) (int, error) {
		return saga.Run(ctx, nil, func(ctx workflow.Context, s *saga.Saga) (int, error) {
			ctx = workflow.WithActivityOptions(ctx, policy.StepOptions(time.Minute))
			var out int
			err := s.Do(ctx, saga.Step{Name: "charge", Activity: "payments.Charge", Args: []any{amount}}, &out)
			return out, err
		})
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Tenant: "acme"})
	env.RegisterWorkflowWithOptions(order, workflow.RegisterOptions{Name: "Order"})
	env.RegisterActivityWithOptions(charge, tactivity.RegisterOptions{Name: "payments.Charge"})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "order-1"})
	env.ExecuteWorkflow("Order", 42)
	require.NoError(t, env.GetWorkflowError())

	recs, err := l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "order-1"}})
	require.NoError(t, err)
	byOp := map[string]ledger.Record{}
	for _, r := range recs {
		byOp[r.Scope.Operation] = r
	}
	require.Contains(t, byOp, "payments.Charge")
	require.Contains(t, byOp, saga.Operation)
	step := byOp["payments.Charge"].Origin
	require.Equal(t, "order-1", step.WorkflowID)
	require.NotEmpty(t, step.RunID)
	require.Equal(t, "Order", step.WorkflowType)
	require.Equal(t, "payments.Charge", step.ActivityType)
	sg := byOp[saga.Operation].Origin
	require.Equal(t, "order-1", sg.WorkflowID)
	require.Equal(t, step.RunID, sg.RunID)
	require.Equal(t, "Order", sg.WorkflowType, "a saga's record names the workflow that runs it")

	byRun, err := l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{RunID: step.RunID}})
	require.NoError(t, err)
	require.Len(t, byRun, len(recs))
}

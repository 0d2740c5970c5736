package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// The interceptor carries the tenant to activities and child workflows, and a key handed
// to one activity call to that activity only, never into a child workflow.
func TestHeaders_TenantAndKey(t *testing.T) {
	t.Parallel()
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Tenant: "fallback"})
	type seen struct{ Tenant, Key string }
	env.RegisterActivityWithOptions(func(ctx context.Context) (seen, error) {
		tenant, _ := keys.TenantFrom(ctx)
		key, _ := keys.KeyFrom(ctx)
		return seen{tenant, string(key)}, nil
	}, tactivity.RegisterOptions{Name: "observe"})
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context) (seen, error) {
		tenant, _ := keys.TenantFrom(ctx)
		_, hasKey := keys.KeyFrom(ctx)
		s := seen{Tenant: tenant}
		if hasKey {
			s.Key = "leaked"
		}
		return s, nil
	}, workflow.RegisterOptions{Name: "child"})
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context) ([]seen, error) {
		ctx = workflow.WithValue(ctx, keys.TenantContextKey, "tenant-1")
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
		var withKey, without, child seen
		if err := workflow.ExecuteActivity(workflow.WithValue(actx, keys.KeyContextKey, keys.Key("step-key")), "observe").Get(ctx, &withKey); err != nil {
			return nil, err
		}
		if err := workflow.ExecuteActivity(actx, "observe").Get(ctx, &without); err != nil {
			return nil, err
		}
		cctx := workflow.WithChildOptions(workflow.WithValue(ctx, keys.KeyContextKey, keys.Key("step-key")), workflow.ChildWorkflowOptions{})
		if err := workflow.ExecuteChildWorkflow(cctx, "child").Get(ctx, &child); err != nil {
			return nil, err
		}
		return []seen{withKey, without, child}, nil
	}, workflow.RegisterOptions{Name: "parent"})
	env.ExecuteWorkflow("parent")
	require.NoError(t, env.GetWorkflowError())
	var got []seen
	require.NoError(t, env.GetWorkflowResult(&got))
	require.Equal(t, []seen{{"tenant-1", "step-key"}, {"tenant-1", ""}, {"tenant-1", ""}}, got)
	require.Equal(t, "oncekit-tenant", worker.TenantHeader)
}

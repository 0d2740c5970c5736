package agenttemporal_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/agent/agenttemporal"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// supportWorkflow is an agent's loop: ask the model, then call the tool it chose.
func supportWorkflow(ctx workflow.Context, ticket string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3}})
	var args json.RawMessage
	if err := workflow.ExecuteActivity(ctx, "model", ticket).Get(ctx, &args); err != nil {
		return "", err
	}
	res, err := agenttemporal.ExecuteTool(ctx, "acme", "1", "send_email", args)
	if err != nil {
		return "", err
	}
	return string(res.Output), nil
}

// A workflow that is run again under the same ID, as a reset or a resubmission does,
// asks the model again; the model chooses another address, and the tool activity is
// refused with both argument sets instead of sending a second email.
func TestExecuteTool_ChangedArgumentsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	g, err := agent.New(l, nil)
	require.NoError(t, err)

	var sent atomic.Int64
	acts := agenttemporal.New(g)
	acts.Register(agent.Tool{Name: "send_email", AcceptsKey: true}, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		sent.Add(1)
		if inv.Call.Task != "support-ticket-1" {
			return nil, ledger.NotApplied(errors.New("the task is not the workflow: " + inv.Call.Task))
		}
		return json.RawMessage(`{"id":"em_1"}`), nil
	})
	answers := []string{`{"to":"ann@example.com"}`, `{"to":"bob@example.com"}`}
	var asked atomic.Int64

	run := func() (*ttestsuite.TestWorkflowEnvironment, error) {
		var s ttestsuite.WorkflowTestSuite
		env := s.NewTestWorkflowEnvironment()
		env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "support-ticket-1"})
		env.RegisterWorkflow(supportWorkflow)
		env.RegisterActivityWithOptions(func(ctx context.Context, ticket string) (json.RawMessage, error) {
			return json.RawMessage(answers[asked.Add(1)-1]), nil
		}, tactivity.RegisterOptions{Name: "model"})
		env.RegisterActivityWithOptions(acts.CallTool, tactivity.RegisterOptions{Name: agenttemporal.ActivityName})
		env.ExecuteWorkflow(supportWorkflow, "ticket-1")
		require.True(t, env.IsWorkflowCompleted())
		return env, env.GetWorkflowError()
	}

	env, err := run()
	require.NoError(t, err)
	var out string
	require.NoError(t, env.GetWorkflowResult(&out))
	require.JSONEq(t, `{"id":"em_1"}`, out)

	_, err = run()
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, agenttemporal.ErrTypeArgumentsChanged, appErr.Type())
	require.True(t, appErr.NonRetryable())
	var d agenttemporal.ChangedDetails
	require.NoError(t, appErr.Details(&d))
	require.JSONEq(t, answers[0], string(d.Stored))
	require.JSONEq(t, answers[1], string(d.New))
	require.Equal(t, "1", d.Step)
	require.EqualValues(t, 1, sent.Load(), "the email is sent once")
}

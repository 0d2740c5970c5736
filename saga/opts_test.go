package saga_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/saga"
)

// Options no run can use end Run at once, before any step, with an error that names
// the field: a negative Lease, a Request that does not encode as JSON, an invalid Key.
func TestOpts_Invalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts saga.Opts
		want string
	}{
		{"NegativeLease", saga.Opts{Key: "order-1", Lease: -1}, "Opts.Lease must not be negative"},
		{"RequestNotJSON", saga.Opts{Key: "order-1", Request: make(chan int)}, "Opts.Request does not encode as JSON"},
		{"InvalidKey", saga.Opts{Key: "tab\there"}, "key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s ttestsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			steps := 0
			env.ExecuteWorkflow(func(ctx workflow.Context) (string, error) {
				return saga.Run(ctx, &tc.opts, func(ctx workflow.Context, s *saga.Saga) (string, error) {
					steps++
					return "done", nil
				})
			})
			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.Zero(t, steps)
		})
	}
}

// A step whose context carries no activity options runs with bounded ones, so that a
// step that keeps failing ends in compensation; compensations retry for as long as an
// outage can last.
func TestOptionsDefault_StepsGiveUpCompensationsDoNot(t *testing.T) {
	t.Parallel()
	step := saga.StepOptionsDefault()
	require.Equal(t, time.Minute, step.StartToCloseTimeout)
	require.NotNil(t, step.RetryPolicy)
	require.Positive(t, step.RetryPolicy.MaximumAttempts, "a step's retries are bounded")
	comp := saga.CompensationOptionsDefault()
	require.Equal(t, time.Minute, comp.StartToCloseTimeout)
	require.Greater(t, comp.ScheduleToCloseTimeout, step.StartToCloseTimeout*time.Duration(step.RetryPolicy.MaximumAttempts),
		"a compensation outlasts every attempt of a step")
}

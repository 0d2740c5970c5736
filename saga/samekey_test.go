package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

// ran is how one saga.Run of a workflow ended, as the workflow saw it.
type ran struct {
	Out       string `json:"out"`
	ErrType   string `json:"err_type"`
	ErrText   string `json:"err_text"`
	CauseType string `json:"cause_type"`
}

func ranOf(out string, err error) ran {
	r := ran{Out: out}
	if err == nil {
		return r
	}
	r.ErrText = err.Error()
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		r.ErrType = app.Type()
		var cause *temporal.ApplicationError
		if errors.As(errors.Unwrap(app), &cause) {
			r.CauseType = cause.Type()
		}
	}
	return r
}

// twiceWorkflow runs the transfer's saga twice with the same key in one workflow: one
// after the other, or in two coroutines at once.
func twiceWorkflow(ctx workflow.Context, tr transfer, concurrent bool) ([]ran, error) {
	out := make([]ran, 2)
	if !concurrent {
		for i := range out {
			out[i] = ranOf(transferWorkflow(ctx, tr))
		}
		return out, nil
	}
	wg := workflow.NewWaitGroup(ctx)
	for i := range out {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			out[i] = ranOf(transferWorkflow(ctx, tr))
		})
	}
	wg.Wait(ctx)
	return out, nil
}

// countingWorkflow runs a two-step saga with the key "count" in each of two coroutines
// at once; its steps and compensations are counters.
func countingWorkflow(ctx workflow.Context) ([]ran, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
	fn := func(ctx workflow.Context, s *saga.Saga) (string, error) {
		for _, step := range []string{"a", "b"} {
			if err := s.Do(ctx, saga.Step{Name: step, Activity: "count", Args: []any{step}, Compensation: "count", CompensationArgs: []any{"undo-" + step}}, nil); err != nil {
				return "", err
			}
		}
		return "done", nil
	}
	out := make([]ran, 2)
	wg := workflow.NewWaitGroup(ctx)
	for i := range out {
		wg.Add(1)
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			out[i] = ranOf(saga.Run(ctx, &saga.Opts{Key: "count"}, fn))
		})
	}
	wg.Wait(ctx)
	return out, nil
}

// nestedWorkflow runs the transfer's saga inside the saga of the same key.
func nestedWorkflow(ctx workflow.Context, tr transfer) (string, error) {
	key, err := keys.Business("transfer", tr.ID)
	if err != nil {
		return "", err
	}
	return saga.Run(ctx, &saga.Opts{Key: key, Request: tr}, func(ctx workflow.Context, _ *saga.Saga) (string, error) {
		return transferWorkflow(ctx, tr)
	})
}

// Two sagas with one key in one workflow run the saga's steps once: the later one (or,
// when both start at once, the one that did not start first) waits for the other and
// returns the same outcome, as a later workflow with the key would.
func TestRun_SameKeyTwiceInOneWorkflow(t *testing.T) {
	t.Parallel()
	for _, concurrent := range []bool{false, true} {
		for _, refused := range []bool{false, true} {
			t.Run(fmt.Sprintf("Concurrent%vRefused%v", concurrent, refused), func(t *testing.T) {
				t.Parallel()
				k := newBank(t)
				k.refuseNotify.Store(refused)
				tr := transfer{ID: "twice", Amount: 100}
				env := k.env("wf-twice")
				env.RegisterWorkflowWithOptions(twiceWorkflow, workflow.RegisterOptions{Name: "twice"})
				env.ExecuteWorkflow("twice", tr, concurrent)
				require.NoError(t, env.GetWorkflowError())
				var got []ran
				require.NoError(t, env.GetWorkflowResult(&got))
				require.Len(t, got, 2)
				require.Equal(t, got[0], got[1], "both sagas return the same outcome")
				for _, step := range []string{"withdraw", "deposit", "notify"} {
					require.EqualValues(t, 1, k.count(step), "%s ran more than once: %+v", step, got)
				}
				if refused {
					require.Equal(t, policy.ErrTypeCompensated, got[0].ErrType)
					require.Equal(t, "Refused", got[0].CauseType)
					require.Equal(t, []string{"do:withdraw", "do:deposit", "undo:notify", "undo:deposit", "undo:withdraw"}, k.logOf(t))
				} else {
					require.Empty(t, got[0].ErrType)
					require.Equal(t, "withdraw:twice,deposit:twice,notify:twice", got[0].Out)
				}
			})
		}
	}
	// On Temporal's own environment with the in-memory records, where both runs start
	// before either ends.
	t.Run("InMemoryRecords", func(t *testing.T) {
		t.Parallel()
		var s ttestsuite.WorkflowTestSuite
		s.SetLogger(devenv.QuietLogger())
		env := s.NewTestWorkflowEnvironment()
		testsuite.RegisterSagaInMemory(env)
		var mu sync.Mutex
		calls := map[string]int{}
		env.RegisterActivityWithOptions(func(_ context.Context, name string) error {
			mu.Lock()
			defer mu.Unlock()
			calls[name]++
			return nil
		}, tactivity.RegisterOptions{Name: "count"})
		env.RegisterWorkflowWithOptions(countingWorkflow, workflow.RegisterOptions{Name: "counting"})
		env.ExecuteWorkflow("counting")
		require.NoError(t, env.GetWorkflowError())
		var got []ran
		require.NoError(t, env.GetWorkflowResult(&got))
		require.Equal(t, []ran{{Out: "done"}, {Out: "done"}}, got)
		require.Equal(t, map[string]int{"a": 1, "b": 1}, calls, "the saga's steps ran once")
	})
	// A saga's function that runs the saga of its own key would wait for itself: it is
	// refused, and the outer saga compensates.
	t.Run("NestedIsRefused", func(t *testing.T) {
		t.Parallel()
		k := newBank(t)
		env := k.env("wf-nested")
		env.RegisterWorkflowWithOptions(nestedWorkflow, workflow.RegisterOptions{Name: "nested"})
		env.ExecuteWorkflow("nested", transfer{ID: "nested", Amount: 1})
		err := env.GetWorkflowError()
		require.ErrorContains(t, err, "inside the saga of the same key")
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app)
		require.Equal(t, policy.ErrTypeCompensated, app.Type())
		require.EqualValues(t, 0, k.count("withdraw"))
	})
}

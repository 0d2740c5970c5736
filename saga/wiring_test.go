package saga_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

// A saga function that returns workflow.NewContinueAsNewError is refused: the saga
// compensates what it did and ends with its compensated error, whose cause says why; the
// workflow does not continue as new over a saga recorded as compensated.
func TestRun_ContinueAsNewInsideTheSagaIsRefused(t *testing.T) {
	t.Parallel()
	m := newMoneyBank(t)
	env := m.env()
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context, o order) (string, error) {
		return saga.Run(ctx, &saga.Opts{Key: orderKey(o.ID)}, func(ctx workflow.Context, s *saga.Saga) (string, error) {
			ctx = workflow.WithActivityOptions(ctx, policy.StepOptions(time.Minute))
			if err := s.Do(ctx, saga.Step{Name: "withdraw", Activity: "withdraw", Args: []any{o}, Compensation: "undo",
				CompensationArgs: []any{"withdraw", o}}, nil); err != nil {
				return "", err
			}
			return "", workflow.NewContinueAsNewError(ctx, "can", o)
		})
	}, workflow.RegisterOptions{Name: "can"})
	env.ExecuteWorkflow("can", order{ID: "can-1"})
	err := env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	require.False(t, errors.As(err, &can), "the workflow continued as new: %v", err)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, compensated, app.Type())
	require.ErrorContains(t, err, "continue-as-new")
	require.Equal(t, 0, m.net(t, "can-1")["withdraw"], "the withdrawal was compensated")
	state, code := m.recorded(t, "can-1")
	require.Equal(t, ledger.StateFailed, state)
	require.Equal(t, compensated, code)
}

// env is an in-memory environment with the money saga and the oncekit wiring.
func (m *moneyBank) env() *ttestsuite.TestWorkflowEnvironment {
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: m.l, Tenant: "acme"})
	m.register(env)
	return env
}

// A worker without oncekit's plugin cannot record the saga: the workflow fails at once
// with an error that names the plugin, instead of retrying an unregistered activity.
func TestRun_WithoutThePluginFailsFast(t *testing.T) {
	t.Parallel()
	t.Run("InMemory", func(t *testing.T) {
		t.Parallel()
		m := newMoneyBank(t)
		var s ttestsuite.WorkflowTestSuite
		s.SetLogger(devenv.QuietLogger())
		env := s.NewTestWorkflowEnvironment()
		m.register(env) // the saga's own activities, not oncekit's
		env.ExecuteWorkflow("money", order{ID: "no-plugin"})
		err := env.GetWorkflowError()
		require.ErrorContains(t, err, "worker.NewPlugin")
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app)
		require.True(t, app.NonRetryable())
		require.Equal(t, restored, m.net(t, "no-plugin"), "no step ran")
	})
	t.Run("Server", func(t *testing.T) {
		t.Parallel()
		srv := testsuite.StartDevServer(t)
		m := newMoneyBank(t)
		c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger()})
		require.NoError(t, err)
		defer c.Close()
		w := tworker.New(c, "no-plugin", tworker.Options{})
		m.register(w)
		require.NoError(t, w.Start())
		defer w.Stop()
		run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: "no-plugin",
			WorkflowExecutionTimeout: 5 * time.Minute}, "money", order{ID: "no-plugin"})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = run.Get(ctx, nil)
		require.ErrorContains(t, err, "worker.NewPlugin", "the workflow must fail, not keep retrying")
	})
}

// Steps that name their activities by function, as samples-go writes them, have
// compensations that read the step's record without Opts.Operation: registered under the
// function's name, or under another name given at registration.
func TestStepResult_FunctionNamedSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	seen := map[string]string{}
	undo := func(ctx context.Context, name string) error {
		var got string
		rec, err := activity.StepResult(ctx, &got, nil)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		seen[name] = rec.State.String() + " " + got
		return nil
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Tenant: "acme"})
	env.RegisterActivity(Reserve)
	env.RegisterActivityWithOptions(Charge, tactivity.RegisterOptions{Name: "payments.charge"})
	env.RegisterActivityWithOptions(undo, tactivity.RegisterOptions{Name: "undo"})
	env.RegisterActivity(Ship)
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
		return saga.RunErr(ctx, &saga.Opts{Key: "fn-named"}, func(ctx workflow.Context, s *saga.Saga) error {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
				RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
			for _, st := range []saga.Step{
				{Name: "reserve", Activity: Reserve, Args: []any{"o-1"}, Compensation: "undo", CompensationArgs: []any{"reserve"}},
				{Name: "charge", Activity: Charge, Args: []any{"o-1"}, Compensation: "undo", CompensationArgs: []any{"charge"}},
				{Name: "ship", Activity: Ship, Args: []any{"o-1"}},
			} {
				if err := s.Do(ctx, st, nil); err != nil {
					return err
				}
			}
			return nil
		})
	}, workflow.RegisterOptions{Name: "fn-named"})
	env.ExecuteWorkflow("fn-named")
	var app *temporal.ApplicationError
	require.ErrorAs(t, env.GetWorkflowError(), &app)
	require.Equal(t, compensated, app.Type(), "%v", env.GetWorkflowError())
	require.Equal(t, map[string]string{"reserve": "completed reserved o-1", "charge": "completed charged o-1"}, seen)
}

// Reserve, Charge and Ship are activities registered by function: their records are
// under the names Temporal gives them ("Reserve"; "payments.charge" for Charge, named
// at registration).
func Reserve(ctx context.Context, id string) (string, error) { return recordStep(ctx, "reserved", id) }

func Charge(ctx context.Context, id string) (string, error) { return recordStep(ctx, "charged", id) }

func Ship(context.Context, string) error {
	return temporal.NewNonRetryableApplicationError("the carrier refused the parcel", "ShipRefused", nil)
}

func recordStep(ctx context.Context, what, id string) (string, error) {
	return activity.Do(ctx, id, func(context.Context, pgx.Tx, activity.Call, string) (string, error) {
		return what + " " + id, nil
	}, nil)
}

// In Temporal's in-memory environment a compensation's "unlimited" attempts stop at 10,
// so one that keeps failing ends the saga CompensationFailed there within the test, not
// after the 24-hour deadline a real server keeps to. The error says so.
func TestRun_InMemoryCompensationFailureSaysAttemptsAreCapped(t *testing.T) {
	t.Parallel()
	m := newMoneyBank(t)
	m.failing.Store("capped", "notify")
	m.outage.Store("capped", "deposit")
	env := m.env()
	env.ExecuteWorkflow("money", order{ID: "capped"})
	err := env.GetWorkflowError()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, policy.ErrTypeCompensationFailed, app.Type())
	require.True(t, strings.Contains(err.Error(), "in-memory") && strings.Contains(err.Error(), "10 attempts"), err.Error())
	require.Equal(t, map[string]int{"withdraw": 0, "deposit": 1, "notify": 0}, m.net(t, "capped"))
}

// StepKey is the key a step's activity runs under; a failed compensation is listed by
// CompensationError.Failed, one that succeeded is not.
func TestSaga_StepKeyAndFailedCompensations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Tenant: "acme"})
	env.RegisterActivityWithOptions(func(ctx context.Context) (string, error) {
		return activity.Do(ctx, "", func(_ context.Context, _ pgx.Tx, c activity.Call, _ string) (string, error) {
			return string(c.Key), nil
		}, nil)
	}, tactivity.RegisterOptions{Name: "keyed"})
	env.RegisterWorkflowWithOptions(func(ctx workflow.Context) (bool, error) {
		var same bool
		err := saga.RunErr(ctx, &saga.Opts{Key: "step-key"}, func(ctx workflow.Context, s *saga.Saga) error {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
			var ran string
			if err := s.Do(ctx, saga.Step{Name: "keyed", Activity: "keyed"}, &ran); err != nil {
				return err
			}
			want, err := s.StepKey("keyed")
			same = err == nil && ran == string(want)
			return nil
		})
		return same, err
	}, workflow.RegisterOptions{Name: "step-key"})
	env.ExecuteWorkflow("step-key")
	require.NoError(t, env.GetWorkflowError())
	var same bool
	require.NoError(t, env.GetWorkflowResult(&same))
	require.True(t, same, "the step's activity ran under StepKey's key")

	ce := &saga.CompensationError{Cause: errors.New("ship refused"), Outcomes: []saga.Outcome{
		{Step: "charge", Err: errors.New("refund failed")}, {Step: "reserve"}}}
	require.Equal(t, []saga.Outcome{ce.Outcomes[0]}, ce.Failed())
}

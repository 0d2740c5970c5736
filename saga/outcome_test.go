package saga_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

// transfer is the input of the outcome tests' saga: withdraw, deposit, notify.
type transfer struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// bank counts the calls of each step and can make the last one fail with a plain error
// (a retryable failure that ends in compensation once the step's attempts are used up).
type bank struct {
	*bundle
	calls      sync.Map // step name -> *atomic.Int64
	failNotify atomic.Bool
	// refuseNotify makes the last step fail definitively, with an ApplicationError of
	// type "Refused".
	refuseNotify atomic.Bool
	gate         chan struct{} // when set, withdraw waits on it
	entered      chan struct{}
}

func newBank(t *testing.T) *bank { return &bank{bundle: setup(t)} }

func (k *bank) count(step string) int64 {
	v, _ := k.calls.LoadOrStore(step, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (k *bank) act(step string) func(context.Context, transfer) (string, error) {
	return func(ctx context.Context, tr transfer) (string, error) {
		v, _ := k.calls.LoadOrStore(step, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		if step == "withdraw" && k.gate != nil {
			select {
			case k.entered <- struct{}{}:
			default:
			}
			<-k.gate
		}
		if step == "notify" && k.failNotify.Load() {
			return "", errors.New("the notification service is down")
		}
		if step == "notify" && k.refuseNotify.Load() {
			return "", temporal.NewNonRetryableApplicationError("the bank refused the transfer", "Refused", nil)
		}
		return step + ":" + tr.ID, k.bundle.step(ctx, step, plan{})
	}
}

func transferWorkflow(ctx workflow.Context, tr transfer) (string, error) {
	key, err := keys.Business("transfer", tr.ID)
	if err != nil {
		return "", err
	}
	co := saga.CompensationOptionsDefault()
	co.RetryPolicy.InitialInterval = time.Millisecond
	return saga.Run(ctx, &saga.Opts{Key: key, Request: tr, CompensationOptions: &co},
		func(ctx workflow.Context, s *saga.Saga) (string, error) {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
				RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 2}})
			var out []string
			for _, step := range []string{"withdraw", "deposit", "notify"} {
				var r string
				if err := s.Do(ctx, saga.Step{Name: step, Activity: step, Args: []any{tr}, Compensation: "undo", CompensationArgs: []any{step, plan{}}}, &r); err != nil {
					return "", err
				}
				out = append(out, r)
			}
			return strings.Join(out, ","), nil
		})
}

func (k *bank) env(id string) *ttestsuite.TestWorkflowEnvironment {
	env := k.bundle.env(nil)
	env.RegisterWorkflowWithOptions(transferWorkflow, workflow.RegisterOptions{Name: "transfer"})
	for _, step := range []string{"withdraw", "deposit", "notify"} {
		env.RegisterActivityWithOptions(k.act(step), tactivity.RegisterOptions{Name: step})
	}
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: id})
	return env
}

// A second workflow for a transfer that completed runs nothing and returns the first
// one's result.
func TestRun_ResubmissionAfterCompletionReplaysResult(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	tr := transfer{ID: "t-1", Amount: 100}
	first := k.env("wf-1")
	first.ExecuteWorkflow("transfer", tr)
	require.NoError(t, first.GetWorkflowError())
	var want string
	require.NoError(t, first.GetWorkflowResult(&want))
	require.Equal(t, "withdraw:t-1,deposit:t-1,notify:t-1", want)

	second := k.env("wf-2")
	second.ExecuteWorkflow("transfer", tr)
	require.NoError(t, second.GetWorkflowError())
	var got string
	require.NoError(t, second.GetWorkflowResult(&got))
	require.Equal(t, want, got)
	for _, step := range []string{"withdraw", "deposit", "notify"} {
		require.EqualValues(t, 1, k.count(step), "the second run called %s", step)
	}
}

// The case of the money transfer: the first run's last step failed and the saga
// compensated. A second workflow for the same transfer, with the last step working
// again, must not replay "withdraw ok, deposit ok" and finish the transfer on top of
// the refunds: it returns the first run's compensated outcome.
func TestRun_ResubmissionAfterCompensationReplaysFailure(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	tr := transfer{ID: "t-2", Amount: 100}
	k.failNotify.Store(true)
	first := k.env("wf-1")
	first.ExecuteWorkflow("transfer", tr)
	firstErr := first.GetWorkflowError()
	var app *temporal.ApplicationError
	require.ErrorAs(t, firstErr, &app)
	require.Equal(t, policy.ErrTypeCompensated, app.Type())

	k.failNotify.Store(false)
	second := k.env("wf-2")
	second.ExecuteWorkflow("transfer", tr)
	secondErr := second.GetWorkflowError()
	require.ErrorAs(t, secondErr, &app)
	require.Equal(t, policy.ErrTypeCompensated, app.Type())
	require.False(t, app.NonRetryable() == false)
	require.Contains(t, secondErr.Error(), `"withdraw" compensated`)
	require.Contains(t, secondErr.Error(), "the notification service is down")
	require.EqualValues(t, 2, k.count("notify"), "only the first run's two attempts ran notify")
	require.EqualValues(t, 1, k.count("withdraw"))
	require.Equal(t, []string{"do:withdraw", "do:deposit", "undo:notify", "undo:deposit", "undo:withdraw"}, k.logOf(t))
}

// A compensated saga's outcome, replayed to a second workflow, is the same error as the
// first workflow's: the same type, the same message, and the failure that started the
// compensation as its cause, which errors.As finds.
func TestRun_ReplayedFailureIsTheSameError(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	tr := transfer{ID: "t-refused", Amount: 100}
	k.refuseNotify.Store(true)
	first := k.env("wf-1")
	first.ExecuteWorkflow("transfer", tr)
	var a1 *temporal.ApplicationError
	require.ErrorAs(t, first.GetWorkflowError(), &a1)
	require.Equal(t, policy.ErrTypeCompensated, a1.Type())
	var c1 *temporal.ApplicationError
	require.ErrorAs(t, errors.Unwrap(a1), &c1, "the first run's error carries its cause")
	require.Equal(t, "Refused", c1.Type())

	k.refuseNotify.Store(false)
	second := k.env("wf-2")
	second.ExecuteWorkflow("transfer", tr)
	var a2 *temporal.ApplicationError
	require.ErrorAs(t, second.GetWorkflowError(), &a2)
	require.Equal(t, a1.Type(), a2.Type())
	require.True(t, a2.NonRetryable())
	require.Equal(t, a1.Message(), a2.Message())
	require.Equal(t, a1.Error(), a2.Error())
	var c2 *temporal.ApplicationError
	require.ErrorAs(t, errors.Unwrap(a2), &c2, "the replayed error has lost its cause: %v", a2)
	require.Equal(t, c1.Type(), c2.Type())
	require.Equal(t, c1.Message(), c2.Message())
	require.Equal(t, c1.NonRetryable(), c2.NonRetryable())
	require.EqualValues(t, 1, k.count("notify"), "the second run ran no step")
}

// A second workflow submitted while the first is still in flight waits for it, then
// returns its outcome without running a step.
func TestRun_ResubmissionInFlightWaits(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	k.gate, k.entered = make(chan struct{}), make(chan struct{}, 1)
	tr := transfer{ID: "t-3", Amount: 100}
	first := k.env("wf-1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		first.ExecuteWorkflow("transfer", tr)
	}()
	<-k.entered // the first run holds the saga's key and is inside withdraw

	second := k.env("wf-2")
	secondDone := make(chan struct{})
	go func() {
		defer close(secondDone)
		second.ExecuteWorkflow("transfer", tr)
	}()
	select {
	case <-secondDone:
		t.Fatal("the second run finished while the first was still in flight")
	case <-time.After(500 * time.Millisecond):
	}
	close(k.gate)
	<-done
	<-secondDone
	require.NoError(t, first.GetWorkflowError())
	require.NoError(t, second.GetWorkflowError())
	var a, b string
	require.NoError(t, first.GetWorkflowResult(&a))
	require.NoError(t, second.GetWorkflowResult(&b))
	require.Equal(t, a, b)
	require.EqualValues(t, 1, k.count("withdraw"), "the second run waited instead of running a step")
	require.EqualValues(t, 1, k.count("notify"))
}

// A saga key reused for another request is refused, not replayed.
func TestRun_KeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	first := k.env("wf-1")
	first.ExecuteWorkflow("transfer", transfer{ID: "t-4", Amount: 100})
	require.NoError(t, first.GetWorkflowError())
	second := k.env("wf-2")
	second.ExecuteWorkflow("transfer", transfer{ID: "t-4", Amount: 999})
	var app *temporal.ApplicationError
	require.ErrorAs(t, second.GetWorkflowError(), &app)
	require.Equal(t, policy.ErrTypeKeyReused, app.Type())
	require.EqualValues(t, 1, k.count("withdraw"))
}

// A compensated workflow's error says each cause once.
func TestRun_ErrorSaysEachCauseOnce(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	k.failNotify.Store(true)
	env := k.env("wf-1")
	env.ExecuteWorkflow("transfer", transfer{ID: "t-5", Amount: 1})
	err := env.GetWorkflowError()
	require.Error(t, err)
	require.Equal(t, 1, strings.Count(err.Error(), "the notification service is down"), err.Error())
	require.Equal(t, 1, strings.Count(err.Error(), `"deposit" compensated`), err.Error())

	// A wiring error (no ledger on the worker) is said once too.
	bare := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Tenant: "acme"})
	bare.RegisterWorkflowWithOptions(transferWorkflow, workflow.RegisterOptions{Name: "transfer"})
	bare.ExecuteWorkflow("transfer", transfer{ID: "t-6", Amount: 1})
	err = bare.GetWorkflowError()
	require.ErrorContains(t, err, "no ledger")
	require.Equal(t, 1, strings.Count(err.Error(), "no ledger"), err.Error())
}

// A compensation reads what its step stored: the result of a completed step, nothing
// for a step that never ran, the failure of a step that failed definitively.
func TestStepResult_CompensationReadsItsStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	seen := map[string]string{}
	inspect := func(ctx context.Context, name string, p plan) error {
		var done bool
		rec, err := activity.StepResult(ctx, &done, &activity.Opts{Operation: "test.step"})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		seen[name] = rec.State.String()
		if done {
			seen[name] += "+result"
		}
		stepKey, _ := keys.Derive(keys.Key(p.Key), name)
		if rec.Key != stepKey || rec.DownstreamKey == "" {
			seen[name] = "wrong key " + string(rec.Key)
		}
		return nil
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Tenant: "acme"})
	env.RegisterWorkflowWithOptions(inspectWorkflow, workflow.RegisterOptions{Name: "saga"})
	env.RegisterActivityWithOptions(b.step, tactivity.RegisterOptions{Name: "step"})
	env.RegisterActivityWithOptions(inspect, tactivity.RegisterOptions{Name: "undo"})
	env.ExecuteWorkflow("saga", plan{Key: "order-inspect", Steps: []string{"reserve", "charge"}, FailAt: "charge"})
	require.Error(t, env.GetWorkflowError())
	require.Equal(t, map[string]string{"reserve": "completed+result", "charge": "failed"}, seen)

	// A step whose activity failed before it recorded anything has nothing to undo.
	env = testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Tenant: "acme"})
	env.RegisterWorkflowWithOptions(inspectWorkflow, workflow.RegisterOptions{Name: "saga"})
	env.RegisterActivityWithOptions(func(context.Context, string, plan) error { return errors.New("refused at the door") }, tactivity.RegisterOptions{Name: "step"})
	env.RegisterActivityWithOptions(inspect, tactivity.RegisterOptions{Name: "undo"})
	env.ExecuteWorkflow("saga", plan{Key: "order-inspect-2", Steps: []string{"ship"}})
	require.Error(t, env.GetWorkflowError())
	require.Equal(t, "not run", seen["ship"])
}

func inspectWorkflow(ctx workflow.Context, p plan) (string, error) {
	return saga.Run(ctx, &saga.Opts{Key: keys.Key(p.Key)}, func(ctx workflow.Context, s *saga.Saga) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 1}})
		for _, name := range p.Steps {
			if err := s.Do(ctx, saga.Step{Name: name, Activity: "step", Args: []any{name, p}, Compensation: "undo"}, nil); err != nil {
				return "", err
			}
		}
		return "", nil
	})
}

// A step whose context names no retry policy gets the bounded step policy: a step that
// keeps failing with a plain error is tried policy.StepMaxAttemptsDefault times, and the
// saga compensates instead of retrying forever. Compensations get no attempt limit but a
// 24-hour deadline. (Temporal's in-memory environment caps "unlimited" at 10 attempts, so
// the compensation here succeeds on its ninth.)
func TestDo_StepsHaveBoundedRetries(t *testing.T) {
	t.Parallel()
	co := saga.CompensationOptionsDefault()
	require.Zero(t, co.RetryPolicy.MaximumAttempts, "compensations have no attempt limit")
	require.Equal(t, policy.CompensationDeadlineDefault, co.ScheduleToCloseTimeout)
	var stepAttempts, undoAttempts atomic.Int64
	var deadline atomic.Int64
	for _, withOptions := range []bool{false, true} {
		stepAttempts.Store(0)
		undoAttempts.Store(0)
		b := setup(t)
		env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Tenant: "acme"})
		env.RegisterActivityWithOptions(func(context.Context) error {
			stepAttempts.Add(1)
			return errors.New("the downstream is down")
		}, tactivity.RegisterOptions{Name: "flaky"})
		env.RegisterActivityWithOptions(func(ctx context.Context) error {
			deadline.Store(int64(tactivity.GetInfo(ctx).ScheduleToCloseTimeout))
			if undoAttempts.Add(1) < 9 {
				return errors.New("the database is restarting")
			}
			return nil
		}, tactivity.RegisterOptions{Name: "undo.flaky"})
		env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
			return saga.RunErr(ctx, &saga.Opts{Key: "bounded"}, func(ctx workflow.Context, s *saga.Saga) error {
				if withOptions { // options, but no retry policy
					ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
				}
				return s.Do(ctx, saga.Step{Name: "flaky", Activity: "flaky", Compensation: "undo.flaky"}, nil)
			})
		}, workflow.RegisterOptions{Name: "bounded"})
		env.ExecuteWorkflow("bounded")
		var app *temporal.ApplicationError
		require.ErrorAs(t, env.GetWorkflowError(), &app)
		require.Equal(t, policy.ErrTypeCompensated, app.Type(), "undo attempts %d: %v", undoAttempts.Load(), env.GetWorkflowError())
		require.EqualValues(t, policy.StepMaxAttemptsDefault, stepAttempts.Load())
		require.EqualValues(t, 9, undoAttempts.Load())
		require.EqualValues(t, policy.CompensationDeadlineDefault, deadline.Load())
	}
}

// While a compensation runs (here: one that waits, as one retrying through an outage
// would), the workflow answers the status query with the compensation in flight.
func TestRun_StatusQueryShowsCompensationInFlight(t *testing.T) {
	t.Parallel()
	k := newBank(t)
	k.failNotify.Store(true)
	inUndo, release := make(chan struct{}), make(chan struct{})
	env := k.bundle.env(nil)
	env.RegisterWorkflowWithOptions(transferWorkflow, workflow.RegisterOptions{Name: "transfer"})
	for _, step := range []string{"withdraw", "deposit", "notify"} {
		env.RegisterActivityWithOptions(k.act(step), tactivity.RegisterOptions{Name: step})
	}
	var once sync.Once
	env.RegisterActivityWithOptions(func(ctx context.Context, name string, p plan) error {
		if name == "deposit" {
			once.Do(func() { close(inUndo) })
			<-release
		}
		return k.undo(ctx, name, p)
	}, tactivity.RegisterOptions{Name: "undo"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.ExecuteWorkflow("transfer", transfer{ID: "t-status", Amount: 1})
	}()
	<-inUndo
	v, err := env.QueryWorkflow(saga.QueryStatus)
	require.NoError(t, err)
	var st saga.Status
	require.NoError(t, v.Get(&st))
	require.Equal(t, "compensating", st.Phase)
	require.Equal(t, []string{"deposit"}, st.Compensating)
	require.Equal(t, []string{"notify: ok"}, st.Compensated)
	require.Equal(t, []string{"withdraw", "deposit", "notify"}, st.Steps)
	require.False(t, st.Since.IsZero())
	close(release)
	<-done
	require.Error(t, env.GetWorkflowError())
}

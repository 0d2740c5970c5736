package saga_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// plan is the input of the test saga.
type plan struct {
	Key      string   `json:"key"`
	Steps    []string `json:"steps"`
	FailAt   string   `json:"fail_at"`  // this step fails definitively
	TimeOut  string   `json:"time_out"` // this step takes effect, then times out
	BadUndo  string   `json:"bad_undo"` // this step's compensation always fails
	Parallel bool     `json:"parallel"`
	Twice    bool     `json:"twice"` // call Compensate twice
	Block    string   `json:"block"` // this step waits until the workflow is cancelled
}

func sagaWorkflow(ctx workflow.Context, p plan) (string, error) {
	co := workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 3}}
	opts := &saga.Opts{Key: keys.Key(p.Key), Parallel: p.Parallel, CompensationOptions: &co}
	return saga.Run(ctx, opts, func(ctx workflow.Context, s *saga.Saga) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 3}})
		for _, name := range p.Steps {
			err := s.Do(ctx, saga.Step{Name: name, Activity: "step", Args: []any{name, p}, Compensation: "undo"}, nil)
			if err != nil {
				if p.Twice {
					_ = s.Compensate(ctx, err)
					return "", s.Compensate(ctx, err)
				}
				return "", err
			}
		}
		return "done", nil
	})
}

type bundle struct {
	pool *pgxpool.Pool
	l    *ledger.Ledger
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE log (id bigserial PRIMARY KEY, kind text NOT NULL, step text NOT NULL, key text NOT NULL)`)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, l: l}
}

// step and undo write their effect to the log under the key the saga handed them.
func (b *bundle) step(ctx context.Context, name string, p plan) error {
	if name == p.Block {
		<-ctx.Done()
		return ctx.Err()
	}
	_, err := activity.Do(ctx, name, func(ctx context.Context, tx pgx.Tx, call activity.Call, name string) (bool, error) {
		if name == p.FailAt {
			return false, activity.Definitive("step_failed", name+" failed")
		}
		_, err := tx.Exec(ctx, `INSERT INTO log (kind, step, key) VALUES ('do', $1, $2)`, name, string(call.Key))
		return true, err
	}, &activity.Opts{Operation: "test.step"})
	if err == nil && name == p.TimeOut {
		return temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil)
	}
	return err
}

func (b *bundle) undo(ctx context.Context, name string, p plan) error {
	if name == p.BadUndo {
		return errors.New("the compensation's downstream is down")
	}
	_, err := activity.Do(ctx, name, func(ctx context.Context, tx pgx.Tx, call activity.Call, name string) (bool, error) {
		_, err := tx.Exec(ctx, `INSERT INTO log (kind, step, key) VALUES ('undo', $1, $2)`, name, string(call.Key))
		return true, err
	}, &activity.Opts{Operation: "test.undo"})
	return err
}

func (b *bundle) env(faults *testsuite.FaultPlan) *ttestsuite.TestWorkflowEnvironment {
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: b.l, Faults: faults, Tenant: "acme"})
	env.RegisterWorkflowWithOptions(sagaWorkflow, workflow.RegisterOptions{Name: "saga"})
	env.RegisterActivityWithOptions(b.step, tactivity.RegisterOptions{Name: "step"})
	env.RegisterActivityWithOptions(b.undo, tactivity.RegisterOptions{Name: "undo"})
	return env
}

// logOf returns the log as "kind:step" in the order it was written.
func (b *bundle) logOf(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT kind || ':' || step FROM log ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func TestSaga_CompensatesInReverseOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.ExecuteWorkflow("saga", plan{Key: "order-1", Steps: []string{"reserve", "charge", "ship"}, FailAt: "ship"})
	err := env.GetWorkflowError()
	require.ErrorContains(t, err, `"charge" compensated; "reserve" compensated`)
	// ship failed definitively and its compensation ran too: registered before the step.
	require.Equal(t, []string{"do:reserve", "do:charge", "undo:ship", "undo:charge", "undo:reserve"}, b.logOf(t))
}

func TestSaga_ParallelCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.ExecuteWorkflow("saga", plan{Key: "order-2", Steps: []string{"a", "b", "c", "d"}, FailAt: "d", Parallel: true})
	require.Error(t, env.GetWorkflowError())
	log := b.logOf(t)
	require.ElementsMatch(t, []string{"do:a", "do:b", "do:c", "undo:a", "undo:b", "undo:c", "undo:d"}, log)
}

// A compensation that keeps failing does not stop the others, and the saga ends with
// an error that names it.
func TestSaga_FailingCompensationContinues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.ExecuteWorkflow("saga", plan{Key: "order-3", Steps: []string{"reserve", "charge", "ship"}, FailAt: "ship", BadUndo: "charge"})
	err := env.GetWorkflowError()
	require.ErrorContains(t, err, `compensation of "charge" FAILED`)
	require.ErrorContains(t, err, `"reserve" compensated`)
	require.Equal(t, []string{"do:reserve", "do:charge", "undo:ship", "undo:reserve"}, b.logOf(t))
}

// A step that took effect and then timed out is compensated.
func TestSaga_TimedOutStepIsCompensated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.ExecuteWorkflow("saga", plan{Key: "order-4", Steps: []string{"reserve", "charge"}, TimeOut: "charge"})
	require.Error(t, env.GetWorkflowError())
	require.Equal(t, []string{"do:reserve", "do:charge", "undo:charge", "undo:reserve"}, b.logOf(t))
}

// A cancelled workflow still compensates: compensations run on a disconnected context.
func TestSaga_CancelledWorkflowCompensates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)
	env.ExecuteWorkflow("saga", plan{Key: "order-5", Steps: []string{"reserve", "charge", "ship"}, Block: "charge"})
	require.Error(t, env.GetWorkflowError())
	require.Equal(t, []string{"do:reserve", "undo:charge", "undo:reserve"}, b.logOf(t))
}

// A compensation runs once: when its first attempt crashes after its effect, when
// Compensate is called twice, and when a second workflow with the same saga key
// compensates again.
func TestSaga_CompensationRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	faults := testsuite.NewFaultPlan().CrashAfterEffect("undo", 1)
	env := b.env(faults)
	p := plan{Key: "order-6", Steps: []string{"reserve", "charge", "ship"}, FailAt: "ship", Twice: true}
	env.ExecuteWorkflow("saga", p)
	require.Error(t, env.GetWorkflowError())
	require.Len(t, faults.Injected(), 3, "every compensation lost its first completion")

	again := b.env(nil) // a duplicate submission of the same order
	again.ExecuteWorkflow("saga", p)
	require.Error(t, again.GetWorkflowError())
	require.Equal(t, []string{"do:reserve", "do:charge", "undo:ship", "undo:charge", "undo:reserve"}, b.logOf(t))
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM log WHERE kind = 'undo' AND step = 'charge'`)
}

// Every step and compensation carries its own derived key.
func TestSaga_Keys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := b.env(nil)
	env.ExecuteWorkflow("saga", plan{Key: "order-7", Steps: []string{"reserve", "charge"}, FailAt: "charge"})
	require.Error(t, env.GetWorkflowError())
	reserveKey, err := keys.Derive("order-7", "reserve")
	require.NoError(t, err)
	undoKey, err := keys.Derive(reserveKey, saga.CompensatePurpose)
	require.NoError(t, err)
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM log WHERE kind = 'do' AND step = 'reserve' AND key = $1`, string(reserveKey))
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM log WHERE kind = 'undo' AND step = 'reserve' AND key = $1`, string(undoKey))
}

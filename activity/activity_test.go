package activity_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
)

// A workflow activity completes its local effect and crashes before reporting
// completion: the retry replays the stored result, and the effect exists once. The same
// crash on a plain activity duplicates the effect, which shows the fault is real.
func TestDo_CrashBeforeComplete(t *testing.T) {
	t.Parallel()
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "Activity", true: "LocalActivity"}[local], func(t *testing.T) {
			t.Parallel()
			l, pool := setup(t)
			req := reserveReq{OrderID: "o-1", SKU: "book", Qty: 2}
			effects := func(ctx context.Context) (int, error) { return countWhere(ctx, pool, "reservations", req.OrderID) }

			act := reserveOrder
			if local {
				act = reserveByOrder // see testsuite.Case.Local
			}
			testsuite.CheckCrashBeforeComplete(t, testsuite.Case[reserveReq]{
				Name: "inventory.reserve", Activity: act, Request: req, Ledger: l, Effects: effects, Local: local,
			})

			req.OrderID = "o-2"
			rep, err := testsuite.RunCrashBeforeComplete(testsuite.Case[reserveReq]{
				Name: "inventory.reserve.plain", Activity: plainReserve(pool), Request: req, Ledger: l, Local: local,
				Effects: func(ctx context.Context) (int, error) { return countWhere(ctx, pool, "reservations", req.OrderID) },
			})
			require.NoError(t, err)
			require.Equal(t, 2, rep.Effects, "the plain activity runs its effect again after the crash")
			require.False(t, rep.SameResult())
		})
	}
}

// An external call completes and the attempt crashes before reporting: the retry
// replays the stored result and the provider is charged once. A call that fails in a
// way that may have charged is re-driven with the same downstream key.
func TestExternal_CrashAndUncertainCall(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	calls := 0
	chargeCard := func(ctx context.Context, req chargeReq) (charge, error) {
		return activity.External(ctx, req, func(ctx context.Context, call activity.Call, req chargeReq) (charge, error) {
			calls++
			id, err := providerCharge(ctx, pool, string(call.DownstreamKey), req.OrderID, req.Amount)
			if err == nil && call.Attempt == 1 && req.OrderID == "o-uncertain" {
				// The provider charged, but the response was lost on the way back.
				return charge{}, errors.New("read tcp: connection reset by peer")
			}
			return charge{ChargeID: id}, err
		}, nil)
	}
	testsuite.CheckCrashBeforeComplete(t, testsuite.Case[chargeReq]{
		Name: "payments.charge", Activity: chargeCard, Request: chargeReq{OrderID: "o-crash", Amount: 4200}, Ledger: l,
		Effects: func(ctx context.Context) (int, error) { return countWhere(ctx, pool, "provider_charges", "o-crash") },
	})
	// After the effect, the retry replayed (1 call); after the call and with the answer
	// lost, the retry called again with the same key (2 calls each); crashed before the
	// effect, the retry called once; before-commit does not apply to External, but its
	// run calls once.
	require.Equal(t, 7, calls)

	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(chargeCard, tactivity.RegisterOptions{Name: "payments.charge"})
	env.ExecuteWorkflow(oneActivity, "payments.charge", chargeReq{OrderID: "o-uncertain", Amount: 100})
	require.NoError(t, env.GetWorkflowError())
	testsuite.RequireExactlyOnce(t.Context(), t, pool, "SELECT count(*) FROM provider_charges WHERE order_id = 'o-uncertain'")
	require.Equal(t, 9, calls, "the uncertain call was re-driven once")
}

// The same key with a different payload inside a workflow reaches the workflow as the
// non-retryable key-reused error type.
func TestDo_KeyReusedInWorkflow(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	businessReserve := func(ctx context.Context, req reserveReq) (reservation, error) {
		key, err := keys.Business(req.OrderID, "reserve")
		if err != nil {
			return reservation{}, err
		}
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3) RETURNING id`, req.OrderID, req.SKU, req.Qty).Scan(&id)
			return reservation{ReservationID: id}, err
		}, &activity.Opts{Key: key})
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(businessReserve, tactivity.RegisterOptions{Name: "inventory.reserve"})
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 10}})
		if err := workflow.ExecuteActivity(ctx, "inventory.reserve", reserveReq{OrderID: "o-9", SKU: "pen", Qty: 1}).Get(ctx, nil); err != nil {
			return err
		}
		return workflow.ExecuteActivity(ctx, "inventory.reserve", reserveReq{OrderID: "o-9", SKU: "pen", Qty: 5}).Get(ctx, nil)
	})
	err := env.GetWorkflowError()
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, policy.ErrTypeKeyReused, appErr.Type())
	require.True(t, appErr.NonRetryable())
	testsuite.RequireExactlyOnce(t.Context(), t, pool, "SELECT count(*) FROM reservations WHERE order_id = 'o-9'")
}

// A definitive business failure is non-retryable, typed by its code, and replayed
// identically when the attempt that stored it crashed before reporting.
func TestDo_DefinitiveFailureReplayed(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	runs := 0
	decline := func(ctx context.Context, req chargeReq) (charge, error) {
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req chargeReq) (charge, error) {
			runs++
			return charge{}, activity.Definitive("card_declined", fmt.Sprintf("card declined for %d", req.Amount))
		}, nil)
	}
	plan := testsuite.NewFaultPlan().CrashAfterEffect("payments.charge", 1)
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Faults: plan})
	env.RegisterActivityWithOptions(decline, tactivity.RegisterOptions{Name: "payments.charge"})
	env.ExecuteWorkflow(oneActivity, "payments.charge", chargeReq{OrderID: "o-7", Amount: 999})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, env.GetWorkflowError(), &appErr)
	require.Equal(t, "card_declined", appErr.Type())
	require.True(t, appErr.NonRetryable())
	var code, msg string
	var replayed bool
	require.NoError(t, appErr.Details(&code, &msg, &replayed))
	require.Equal(t, "card declined for 999", msg)
	require.True(t, replayed, "the retry replayed the stored failure")
	require.Equal(t, 1, runs)
	require.Len(t, plan.Injected(), 1)
	_ = pool
}

// Activities fail clearly and non-retryably without a tenant or outside an activity.
func TestOpts_Errors(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	_, err := activity.Do(context.Background(), reserveReq{}, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
		return reservation{}, nil
	}, &activity.Opts{Ledger: l})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, policy.ErrTypeInvalid, appErr.Type())

	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Tenant: ""})
	noTenant := func(ctx context.Context, req reserveReq) (reservation, error) {
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
			return reservation{}, nil
		}, &activity.Opts{Ledger: l, Tenant: "", Key: "k"})
	}
	env.RegisterActivityWithOptions(noTenant, tactivity.RegisterOptions{Name: "x"})
	env.ExecuteWorkflow(oneActivity, "x", reserveReq{OrderID: "o"})
	require.NoError(t, env.GetWorkflowError(), "the environment's default tenant applies")
}

// The tenant set on the workflow's context reaches the activity and scopes its key.
func TestTenantPropagatesToActivities(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(reserveOrder, tactivity.RegisterOptions{Name: "inventory.reserve"})
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		ctx = workflow.WithValue(ctx, keys.TenantContextKey, "tenant-42")
		return oneActivity(ctx, "inventory.reserve", reserveReq{OrderID: "o-t", SKU: "x", Qty: 1})
	})
	require.NoError(t, env.GetWorkflowError())
	var tenant string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT tenant FROM "+pgx.Identifier{l.Schema(), "idempotency_records"}.Sanitize()).Scan(&tenant))
	require.Equal(t, "tenant-42", tenant)
}

func oneActivity(ctx workflow.Context, name string, req any) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Millisecond, MaximumAttempts: 5}})
	return workflow.ExecuteActivity(ctx, name, req).Get(ctx, nil)
}

var _ = ledger.ErrNotFound
var _ *pgxpool.Pool

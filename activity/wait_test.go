package activity_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/testsuite"
)

// An attempt whose key another attempt holds waits for it, heartbeating, and then
// replays the other's result instead of running the effect. The heartbeat timeout
// leaves a wait slice room for its round trips on a loaded machine, or through a Citus
// coordinator.
func TestDo_WaitsHeartbeatingForInFlightDuplicate(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	holding := make(chan struct{})
	var runs, heartbeats atomic.Int32
	slow := func(ctx context.Context, req reserveReq) (reservation, error) {
		key, _ := keys.Business(req.OrderID, "reserve")
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
			runs.Add(1)
			if req.SKU == "first" {
				close(holding)
				time.Sleep(2500 * time.Millisecond) // hold the key while the duplicate waits
			}
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, 'x', 1) RETURNING id`, req.OrderID).Scan(&id)
			return reservation{ReservationID: id}, err
		}, &activity.Opts{Key: key, Operation: "inventory.reserve"})
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(slow, tactivity.RegisterOptions{Name: "first"})
	env.RegisterActivityWithOptions(func(ctx context.Context, req reserveReq) (reservation, error) {
		<-holding
		req.SKU = "first" // the same intent as the first
		return slow(ctx, req)
	}, tactivity.RegisterOptions{Name: "second"})
	env.SetOnActivityHeartbeatListener(func(info *tactivity.Info, _ converter.EncodedValues) {
		if info.ActivityType.Name == "second" {
			heartbeats.Add(1)
		}
	})
	env.ExecuteWorkflow(func(ctx workflow.Context) ([]int64, error) {
		retry := &temporal.RetryPolicy{MaximumAttempts: 1}
		a := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: retry}),
			"first", reserveReq{OrderID: "o-wait", SKU: "first"})
		b := workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
			HeartbeatTimeout: 1500 * time.Millisecond, RetryPolicy: retry}), "second", reserveReq{OrderID: "o-wait"})
		var ra, rb reservation
		if err := a.Get(ctx, &ra); err != nil {
			return nil, err
		}
		err := b.Get(ctx, &rb)
		return []int64{ra.ReservationID, rb.ReservationID}, err
	})
	require.NoError(t, env.GetWorkflowError())
	var ids []int64
	require.NoError(t, env.GetWorkflowResult(&ids))
	require.Equal(t, ids[0], ids[1], "the duplicate replayed the first's result")
	require.Equal(t, int32(1), runs.Load())
	require.Positive(t, heartbeats.Load(), "the duplicate heartbeated while it waited")
	testsuite.RequireExactlyOnce(t.Context(), t, pool, `SELECT count(*) FROM reservations WHERE order_id = 'o-wait'`)
}

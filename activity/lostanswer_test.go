package activity_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
)

// An activity whose commit became durable and whose answer was lost fails with a
// retryable oncekit.OutcomeUnknown error, not a plain error, and its retry replays.
func TestDo_CommittedThenFatalIsRetryableUnknown(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	var schema string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema))
	h := pgtest.NewHeld(t, schema)
	held, err := ledger.New(h.Pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)

	env := func(l *ledger.Ledger) *ttestsuite.TestActivityEnvironment {
		var s ttestsuite.WorkflowTestSuite
		s.SetLogger(devenv.QuietLogger())
		env := s.NewTestActivityEnvironment()
		env.SetWorkerOptions(tworker.Options{BackgroundActivityContext: keys.WithTenant(activity.WithLedger(context.Background(), l), "acme")})
		env.RegisterActivity(reserveByOrder)
		return env
	}
	req := reserveReq{OrderID: "o-lost", SKU: "book", Qty: 1}
	done := h.TerminateAsync(context.Background(), t, 10*time.Second)
	_, err = env(held).ExecuteActivity(reserveByOrder, req)
	<-done
	var appErr *temporal.ApplicationError
	require.True(t, errors.As(err, &appErr), "%v", err)
	require.Equal(t, policy.ErrTypeOutcomeUnknown, appErr.Type())
	require.False(t, appErr.NonRetryable())
	n, err := countWhere(context.Background(), pool, "reservations", req.OrderID)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the commit was durable")

	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	val, err := env(l).ExecuteActivity(reserveByOrder, req)
	require.NoError(t, err)
	var res reservation
	require.NoError(t, val.Get(&res))
	n, err = countWhere(context.Background(), pool, "reservations", req.OrderID)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

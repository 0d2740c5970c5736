package testsuite_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// An External activity that sends its provider a fresh key on every attempt, instead of
// call.DownstreamKey, fails the crash check after the call; counted in the provider's own
// table (no recording Provider), the check's message still names the fix.
func TestCrashCheck_FreshKeyPointsAtDownstreamKey(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, effectsSchema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	o := order{OrderID: "fresh-key", Amount: 100}
	reps, err := testsuite.RunCrashPoints(testsuite.Case[order]{
		Name: "fresh.charge", Request: o, Ledger: l,
		Activity: func(ctx context.Context, o order) (int64, error) {
			return activity.External(ctx, o, func(ctx context.Context, _ activity.Call, o order) (int64, error) {
				return chargeProvider(ctx, pool, uuid.NewString(), o)
			}, nil)
		},
		Effects: func(ctx context.Context) (int, error) {
			return testsuite.Count(ctx, pool, `SELECT count(*) FROM provider_charges WHERE order_id = $1`, o.OrderID)
		},
	})
	require.NoError(t, err)
	var afterCall *testsuite.Report
	for i := range reps {
		if reps[i].Point == testsuite.AfterCall {
			afterCall = &reps[i]
		}
	}
	require.NotNil(t, afterCall, "an External activity reaches the crash after its call")
	problem := afterCall.Problem()
	require.Error(t, problem)
	require.ErrorContains(t, problem, "call.DownstreamKey")
}

package activity_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
)

// On a worker built without oncekit's plugin (the ledger handed in through the context),
// the records of Do and External still carry the activity's origin.
func TestOrigin_WithoutThePlugin(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	charge := func(ctx context.Context, amount int) (int, error) {
		return activity.Do(ctx, amount, func(ctx context.Context, tx pgx.Tx, call activity.Call, amount int) (int, error) {
			return amount, nil
		}, nil)
	}
	refund := func(ctx context.Context, amount int) (int, error) {
		return activity.External(ctx, amount, func(ctx context.Context, call activity.Call, amount int) (int, error) {
			return amount, nil
		}, nil)
	}
	var s ttestsuite.WorkflowTestSuite
	s.SetLogger(devenv.QuietLogger())
	env := s.NewTestActivityEnvironment()
	env.SetWorkerOptions(tworker.Options{BackgroundActivityContext: keys.WithTenant(activity.WithLedger(context.Background(), l), "acme")})
	env.RegisterActivity(charge)
	env.RegisterActivity(refund)
	_, err := env.ExecuteActivity(charge, 42)
	require.NoError(t, err)
	_, err = env.ExecuteActivity(refund, 42)
	require.NoError(t, err)

	recs, err := l.List(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, r := range recs {
		require.NotEmpty(t, r.Origin.WorkflowID, r.Scope.Operation)
		require.NotEmpty(t, r.Origin.RunID, r.Scope.Operation)
		require.Equal(t, r.Scope.Operation, r.Origin.ActivityType, "the activity's type names the record's operation by default")
	}
}

package activity_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
)

func TestKeyFor(t *testing.T) {
	t.Parallel()
	_, err := activity.KeyFor(context.Background(), keys.RunScoped)
	require.ErrorIs(t, err, activity.ErrNotActivity)

	var s ttestsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	keyOf := func(ctx context.Context, strategy keys.Strategy) (string, error) {
		k, err := activity.KeyFor(ctx, strategy)
		return string(k), err
	}
	env.RegisterActivity(keyOf)
	for strategy, prefix := range map[keys.Strategy]string{keys.RunScoped: "v1:run:", keys.WorkflowScoped: "v1:wf:"} {
		val, err := env.ExecuteActivity(keyOf, strategy)
		require.NoError(t, err)
		var got string
		require.NoError(t, val.Get(&got))
		require.True(t, strings.HasPrefix(got, prefix), got)
		require.NoError(t, keys.Key(got).Validate())
	}
}

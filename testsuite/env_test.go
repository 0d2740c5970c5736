package testsuite_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
)

// EnvConfig.Tenant left empty gives each environment a tenant of its own, TenantPrefix,
// a hyphen and 8 random hex digits, so that a second environment on the same ledger runs
// its guarded activity again. Two environments given the same Tenant share records: the
// second replays what the first stored. An invalid Tenant fails the guarded activity
// with a non-retryable ApplicationError of type policy.ErrTypeInvalid.
func TestNewWorkflowEnvironment_Tenant(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE reservations (tenant text NOT NULL, order_id text NOT NULL)`)
	require.NoError(t, err)
	// committed counts the reservations the guarded activity committed for order.
	committed := func(t *testing.T, order string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = $1`, order).Scan(&n))
		return n
	}

	// run runs one workflow whose guarded activity reserves order and returns its
	// tenant, in a new environment with tenant.
	run := func(t *testing.T, tenant, order string) (string, error) {
		t.Helper()
		env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Tenant: tenant})
		env.RegisterActivityWithOptions(func(ctx context.Context, order string) (string, error) {
			return activity.Do(ctx, order, func(ctx context.Context, tx pgx.Tx, _ activity.Call, order string) (string, error) {
				tenant, _ := keys.TenantFrom(ctx)
				_, err := tx.Exec(ctx, `INSERT INTO reservations (tenant, order_id) VALUES ($1, $2)`, tenant, order)
				return tenant, err
			}, nil)
		}, tactivity.RegisterOptions{Name: "reserve"})
		env.RegisterWorkflowWithOptions(func(ctx workflow.Context, order string) (string, error) {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
				RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}})
			var tenant string
			err := workflow.ExecuteActivity(ctx, "reserve", order).Get(ctx, &tenant)
			return tenant, err
		}, workflow.RegisterOptions{Name: "checkout"})
		env.ExecuteWorkflow("checkout", order)
		require.True(t, env.IsWorkflowCompleted())
		if err := env.GetWorkflowError(); err != nil {
			return "", err
		}
		var got string
		require.NoError(t, env.GetWorkflowResult(&got))
		return got, nil
	}

	t.Run("DefaultOwnTenant", func(t *testing.T) {
		first, err := run(t, "", "order-own")
		require.NoError(t, err)
		second, err := run(t, "", "order-own")
		require.NoError(t, err)
		for _, tenant := range []string{first, second} {
			require.True(t, strings.HasPrefix(tenant, testsuite.TenantPrefix+"-"), tenant)
			require.Len(t, tenant, len(testsuite.TenantPrefix)+1+8)
		}
		require.NotEqual(t, first, second)
		require.Equal(t, 2, committed(t, "order-own"), "each environment runs its activity")
	})
	t.Run("SameTenantReplays", func(t *testing.T) {
		for range 2 {
			tenant, err := run(t, "shared", "order-shared")
			require.NoError(t, err)
			require.Equal(t, "shared", tenant)
		}
		require.Equal(t, 1, committed(t, "order-shared"), "the second environment replays the first one's record")
	})
	t.Run("InvalidTenant", func(t *testing.T) {
		_, err := run(t, "tab\there", "order-invalid")
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app)
		require.Equal(t, policy.ErrTypeInvalid, app.Type())
		require.True(t, app.NonRetryable())
		require.Zero(t, committed(t, "order-invalid"))
	})
}

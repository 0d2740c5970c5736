package testsuite_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/testsuite"
)

// A standalone activity (started by a client, with no workflow) is keyed by its activity
// ID and run ID. Run where the server supports standalone activities.
func TestStrategies_StandaloneActivity(t *testing.T) {
	t.Parallel()
	c, pool, queue, _ := setupServerWorker(t)
	ctx := keys.WithTenant(context.Background(), "tenant-sa")
	order := "standalone-" + uuid.NewString()
	h, err := c.ExecuteActivity(ctx, client.StartActivityOptions{ID: order, TaskQueue: queue, StartToCloseTimeout: 10 * time.Second},
		"strategies.reserve", step{OrderID: order, Strategy: "run"})
	if err != nil {
		t.Skipf("the Temporal server does not run standalone activities: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, h.Get(wctx, nil))
	testsuite.RequireExactlyOnce(t.Context(), t, pool, "SELECT count(*) FROM reservations WHERE order_id = $1", order)
}

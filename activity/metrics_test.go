package activity_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/testsuite"
)

// capture is a Temporal metrics handler that counts counters by name and tags.
type capture struct {
	mu     *sync.Mutex
	counts map[string]int64
	tags   map[string]string
}

func newCapture() capture {
	return capture{mu: &sync.Mutex{}, counts: map[string]int64{}, tags: map[string]string{}}
}

func (c capture) WithTags(tags map[string]string) client.MetricsHandler {
	merged := map[string]string{}
	for k, v := range c.tags {
		merged[k] = v
	}
	for k, v := range tags {
		merged[k] = v
	}
	return capture{mu: c.mu, counts: c.counts, tags: merged}
}

func (c capture) Counter(name string) client.MetricsCounter {
	key := name
	if name == activity.MetricCalls {
		key += "/" + c.tags["oncekit_operation"] + "/" + c.tags["oncekit_outcome"]
	}
	return counter{c: c, key: key}
}

func (c capture) Gauge(string) client.MetricsGauge { return client.MetricsNopHandler.Gauge("") }
func (c capture) Timer(string) client.MetricsTimer { return client.MetricsNopHandler.Timer("") }

type counter struct {
	c   capture
	key string
}

func (n counter) Inc(d int64) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	n.c.counts[n.key] += d
}

// Guarded calls are counted through Temporal's metrics handler, tagged with the
// operation and outcome: the first execution, and the replay of its retry after a crash.
func TestActivity_ReportsThroughTemporalMetrics(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	m := newCapture()
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, MetricsHandler: m,
		Faults: testsuite.NewFaultPlan().CrashAfterEffect("inventory.count")})
	env.RegisterActivityWithOptions(func(ctx context.Context, req reserveReq) error {
		return activity.DoErr(ctx, req, func(context.Context, pgx.Tx, activity.Call, reserveReq) error { return nil }, nil)
	}, tactivity.RegisterOptions{Name: "inventory.count"})
	env.ExecuteWorkflow(oneActivity, "inventory.count", reserveReq{OrderID: "o-m"})
	require.NoError(t, env.GetWorkflowError())
	m.mu.Lock()
	defer m.mu.Unlock()
	require.EqualValues(t, 1, m.counts[activity.MetricCalls+"/inventory.count/first"])
	require.EqualValues(t, 1, m.counts[activity.MetricCalls+"/inventory.count/replay"])
}

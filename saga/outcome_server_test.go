package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// The three resubmissions of a keyed saga on a real server: after it completed, after it
// compensated, and while the first run is in flight.
func TestRun_ResubmissionOnRealServer(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	k := newBank(t)
	k.gate, k.entered = make(chan struct{}), make(chan struct{}, 1)
	ctx := keys.WithTenant(context.Background(), "acme")
	plugin, err := worker.NewPlugin(worker.Config{Ledger: k.l})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	defer c.Close()
	w := tworker.New(c, "transfers", tworker.Options{})
	w.RegisterWorkflowWithOptions(transferWorkflow, workflow.RegisterOptions{Name: "transfer"})
	for _, step := range []string{"withdraw", "deposit", "notify"} {
		w.RegisterActivityWithOptions(k.act(step), tactivity.RegisterOptions{Name: step})
	}
	w.RegisterActivityWithOptions(k.undo, tactivity.RegisterOptions{Name: "undo"})
	require.NoError(t, w.Start())
	defer w.Stop()

	start := func(id string, tr transfer) client.WorkflowRun {
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "transfers", WorkflowExecutionTimeout: 2 * time.Minute}, "transfer", tr)
		require.NoError(t, err)
		return run
	}
	get := func(run client.WorkflowRun) (string, error) {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var out string
		err := run.Get(wctx, &out)
		return out, err
	}

	// In flight: the first run waits inside withdraw while the second is submitted.
	inflight := transfer{ID: "t-flight", Amount: 5}
	first := start("flight-1", inflight)
	<-k.entered
	second := start("flight-2", inflight)
	time.Sleep(time.Second) // give the second run time to do the wrong thing
	require.EqualValues(t, 1, k.count("withdraw"), "the second run waits for the first")
	close(k.gate)
	a, err := get(first)
	require.NoError(t, err)
	b, err := get(second)
	require.NoError(t, err)
	require.Equal(t, a, b)
	require.EqualValues(t, 1, k.count("withdraw"))

	// After completion: the result replays, no step runs.
	again, err := get(start("flight-3", inflight))
	require.NoError(t, err)
	require.Equal(t, a, again)
	require.EqualValues(t, 1, k.count("deposit"))

	// After compensation: the failure replays even though the last step works again.
	failed := transfer{ID: "t-comp", Amount: 7}
	k.failNotify.Store(true)
	_, err = get(start("comp-1", failed))
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, policy.ErrTypeCompensated, app.Type())
	notifies := k.count("notify")
	k.failNotify.Store(false)
	_, err = get(start("comp-2", failed))
	require.ErrorAs(t, err, &app)
	require.Equal(t, policy.ErrTypeCompensated, app.Type())
	require.Equal(t, notifies, k.count("notify"), "the second run ran no step")
	// Two transfers, each withdrawn and deposited once.
	testsuite.RequireCount(t.Context(), t, k.pool, 4, `SELECT count(*) FROM log WHERE kind = 'do' AND step IN ('withdraw', 'deposit')`)
}

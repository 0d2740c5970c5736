package saga_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	historypb "go.temporal.io/api/history/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// Histories recorded from a real server, in which a step failed and every compensation
// ran: one written before runs held their saga's key (before Run's commands were
// versioned), and one written since.
const (
	unheldHistoryFile = "testdata/compensated_saga_history.json"
	historyFile       = "testdata/compensated_saga_history_held.json"
)

// The saga is deterministic: each recorded history replays without a nondeterminism
// error, the one written before the saga's commands changed included, so a workflow in
// flight across an upgrade goes on as it began.
func TestSaga_ReplaysRecordedHistory(t *testing.T) {
	t.Parallel()
	for _, file := range []string{unheldHistoryFile, historyFile} {
		r := tworker.NewWorkflowReplayer()
		r.RegisterWorkflowWithOptions(sagaWorkflow, workflow.RegisterOptions{Name: "saga"})
		require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(devenv.QuietLogger(), file), file)
	}
}

// TestSaga_RecordHistory records the newer history replayed above on a real server. It
// runs when ONCEKIT_RECORD_HISTORY=1, after a change to the saga's commands (which must
// be versioned, so that the older histories still replay).
func TestSaga_RecordHistory(t *testing.T) {
	if os.Getenv("ONCEKIT_RECORD_HISTORY") != "1" {
		t.Skip("set ONCEKIT_RECORD_HISTORY=1 to record " + historyFile)
	}
	b := setup(t)
	srv := testsuite.StartDevServer(t)
	ctx := keys.WithTenant(context.Background(), "acme")
	plugin, err := worker.NewPlugin(worker.Config{Ledger: b.l})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	defer c.Close()
	w := tworker.New(c, "saga-record", tworker.Options{})
	w.RegisterWorkflowWithOptions(sagaWorkflow, workflow.RegisterOptions{Name: "saga"})
	w.RegisterActivityWithOptions(b.step, tactivity.RegisterOptions{Name: "step"})
	w.RegisterActivityWithOptions(b.undo, tactivity.RegisterOptions{Name: "undo"})
	require.NoError(t, w.Start())
	defer w.Stop()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: "saga-record", WorkflowExecutionTimeout: time.Minute},
		"saga", plan{Key: "order-recorded", Steps: []string{"reserve", "charge", "ship"}, FailAt: "ship"})
	require.NoError(t, err)
	require.Error(t, run.Get(ctx, nil))
	var h historypb.History
	it := c.GetWorkflowHistory(ctx, run.GetID(), run.GetRunID(), false, 0)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(t, err)
		h.Events = append(h.Events, e)
	}
	b2, err := protojson.MarshalOptions{Indent: "  "}.Marshal(&h)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll("testdata", 0o755))
	require.NoError(t, os.WriteFile(historyFile, b2, 0o644))
}

package outbox_test

import (
	"context"
	tactivity "go.temporal.io/sdk/activity"
	tworker "go.temporal.io/sdk/worker"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// The Temporal publisher starts a workflow whose ID comes from the event ID. The
// dispatcher dies after the first publication and publishes again; Temporal rejects the
// duplicate start, and the workflow's effect, which is not guarded at all, exists once.
func TestTemporalPublisher_DuplicatePublishIsRejectedByTemporal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := testsuite.StartDevServer(t)
	ctx := context.Background()
	l, err := ledger.New(b.pool, &ledger.Config{Schema: b.schema})
	require.NoError(t, err)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "bank"})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.HostPort, Namespace: srv.Namespace, Logger: testsuite.QuietLogger{},
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	queue := "outbox-" + b.schema
	w := tworker.New(c, queue, tworker.Options{})
	w.RegisterWorkflowWithOptions(func(ctx workflow.Context, eventID string, payload []byte) error {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
		return workflow.ExecuteActivity(ctx, "statements.insert", eventID).Get(ctx, nil)
	}, workflow.RegisterOptions{Name: "statements.book"})
	w.RegisterActivityWithOptions(func(ctx context.Context, eventID string) error {
		_, err := b.pool.Exec(ctx, `INSERT INTO statements (event_id, account, amount) VALUES ($1, 'acc', 1)`, uuid.MustParse(eventID))
		return err
	}, tactivity.RegisterOptions{Name: "statements.insert"})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	id := b.produce(t, "acc-t", 100)
	route := func(e outbox.Event) (outbox.TemporalStart, error) {
		return outbox.TemporalStart{Workflow: "statements.book", Args: []any{e.ID.String(), e.Payload},
			Options: client.StartWorkflowOptions{TaskQueue: queue}}, nil
	}
	pub := outbox.TemporalPublisher(c, route)
	dctx, crash := context.WithCancel(ctx)
	first := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		err := pub.Publish(ctx, e)
		crash() // dies before marking the event published
		return err
	}), nil)
	_, err = first.DispatchOnce(dctx)
	require.Error(t, err)
	b.drain(t, b.dispatcher(t, pub, nil))

	run := c.GetWorkflow(ctx, outbox.WorkflowIDPrefix+id.String(), "")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, run.Get(wctx, nil))
	testsuite.RequireExactlyOnce(t, b.pool, `SELECT count(*) FROM statements WHERE event_id = $1`, id)
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Published: 1}, st)
}

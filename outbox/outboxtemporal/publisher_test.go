package outboxtemporal_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/outboxtemporal"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	pool   *pgxpool.Pool
	schema string
	out    *outbox.Outbox
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE statements (id bigserial PRIMARY KEY, event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)
	out, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, out: out}
}

// produce commits an event; the business write beside it does not matter here.
func (b *bundle) produce(t testing.TB, account string, amount int64) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		ids, err := b.out.Enqueue(ctx, tx, outbox.Event{Topic: "transfers", OrderingKey: account, Payload: []byte(`{"amount":1}`)})
		if err == nil {
			id = ids[0]
		}
		return err
	}))
	return id
}

func (b *bundle) dispatcher(t testing.TB, pub outbox.Publisher) *outbox.Dispatcher {
	t.Helper()
	d, err := outbox.NewDispatcher(b.out, pub, nil)
	require.NoError(t, err)
	return d
}

// The Temporal publisher starts a workflow whose ID comes from the event ID. The
// dispatcher dies after the first publication and publishes again; Temporal rejects the
// duplicate start, and the workflow's effect, which is not guarded at all, exists once.
func TestPublisher_DuplicatePublishIsRejectedByTemporal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := testsuite.StartDevServer(t)
	ctx := context.Background()
	l, err := ledger.New(b.pool, &ledger.Config{Schema: b.schema})
	require.NoError(t, err)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "bank"})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
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
	route := func(e outbox.Event) (outboxtemporal.Start, error) {
		return outboxtemporal.Start{Workflow: "statements.book", Args: []any{e.ID.String(), e.Payload},
			Options: client.StartWorkflowOptions{TaskQueue: queue}}, nil
	}
	pub := outboxtemporal.NewPublisher(c, route)
	dctx, crash := context.WithCancel(ctx)
	first := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		err := pub.Publish(ctx, e)
		crash() // dies before marking the event published
		return err
	}))
	_, err = first.DispatchOnce(dctx)
	require.Error(t, err)
	_, err = b.dispatcher(t, pub).Drain(ctx)
	require.NoError(t, err)

	run := c.GetWorkflow(ctx, outboxtemporal.WorkflowIDPrefix+id.String(), "")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, run.Get(wctx, nil))
	testsuite.RequireExactlyOnce(t.Context(), t, b.pool, `SELECT count(*) FROM statements WHERE event_id = $1`, id)
	st, err := b.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Published: 1}, st)
}

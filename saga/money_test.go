package saga_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// moneySteps are the steps of the money saga; each moves one unit, and each has a
// compensation that moves it back only if the step moved it.
var moneySteps = []string{"withdraw", "deposit", "notify"}

// order is the money saga's input. Only ID and Lease make the request; the faults are
// the bank's.
type order struct {
	ID string `json:"id"`
	// Lease is the saga's Opts.Lease, zero for the default.
	Lease time.Duration `json:"lease,omitempty"`
}

// moneyBank moves money in PostgreSQL under the keys the saga hands its steps and
// compensations, so the money can be counted where it is.
type moneyBank struct {
	*bundle
	// failing maps an order ID to the step that fails for it (a retryable error of type
	// ServiceDown, so the step fails after its attempts and the saga compensates).
	failing sync.Map
	// outage maps an order ID to the step whose compensation fails with a retryable
	// error, as during an outage of the bank; entered is sent the order ID at each such
	// failure, when it has room.
	outage  sync.Map
	entered chan string
	// undoGate, when it holds an order ID, makes that order's compensation of the named
	// step block until the channel is closed; undoEntered is sent the order ID.
	undoGate    sync.Map
	undoEntered chan string
}

func newMoneyBank(t *testing.T) *moneyBank {
	t.Helper()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE money (id bigserial PRIMARY KEY, order_id text NOT NULL, step text NOT NULL, amount int NOT NULL)`)
	require.NoError(t, err)
	return &moneyBank{bundle: b, entered: make(chan string, 64), undoEntered: make(chan string, 64)}
}

type undoGate struct {
	step string
	open chan struct{}
}

func (m *moneyBank) step(name string) func(context.Context, order) (string, error) {
	return func(ctx context.Context, o order) (string, error) {
		if f, ok := m.failing.Load(o.ID); ok && f == name {
			return "", temporal.NewApplicationError(fmt.Sprintf("the %s service is down", name), "ServiceDown")
		}
		return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o order) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO money (order_id, step, amount) VALUES ($1, $2, 1)`, o.ID, name)
			return name + ":" + o.ID, err
		}, &activity.Opts{Operation: "money." + name})
	}
}

// undo moves the step's unit back if, and only if, the step moved it.
func (m *moneyBank) undo(ctx context.Context, name string, o order) error {
	if g, ok := m.undoGate.Load(o.ID); ok && g.(undoGate).step == name {
		m.undoEntered <- o.ID
		<-g.(undoGate).open
	}
	if s, ok := m.outage.Load(o.ID); ok && s == name {
		select {
		case m.entered <- o.ID:
		default:
		}
		return errors.New("the bank is unreachable")
	}
	rec, err := activity.StepResult(ctx, nil, &activity.Opts{Operation: "money." + name})
	if err != nil {
		return err
	}
	if rec.State != activity.StepCompleted {
		return nil
	}
	return activity.DoErr(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o order) error {
		_, err := tx.Exec(ctx, `INSERT INTO money (order_id, step, amount) VALUES ($1, $2, -1)`, o.ID, name)
		return err
	}, &activity.Opts{Operation: "money.undo." + name})
}

// net returns, for each step, the units it moved net of its compensation: 1 when it
// moved and was not compensated, 0 when it was compensated or never moved.
func (m *moneyBank) net(t *testing.T, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, s := range moneySteps {
		n, err := testsuite.Count(context.Background(), m.pool, `SELECT coalesce(sum(amount), 0) FROM money WHERE order_id = $1 AND step = $2`, id, s)
		require.NoError(t, err)
		out[s] = n
	}
	return out
}

// moved is the net of a saga that completed, restored that of one that compensated.
var (
	moved    = map[string]int{"withdraw": 1, "deposit": 1, "notify": 1}
	restored = map[string]int{"withdraw": 0, "deposit": 0, "notify": 0}
)

func orderKey(id string) keys.Key {
	k, err := keys.Business("order", id)
	if err != nil {
		panic(err)
	}
	return k
}

// recorded returns the state of the saga's key in the ledger, and the error type of a
// failed one.
func (m *moneyBank) recorded(t *testing.T, id string) (ledger.State, string) {
	t.Helper()
	rec, err := m.l.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: saga.Operation}, orderKey(id))
	require.NoError(t, err)
	return rec.State, rec.ErrorCode
}

func moneyWorkflow(ctx workflow.Context, o order) (string, error) {
	co := saga.CompensationOptionsDefault()
	co.RetryPolicy.InitialInterval = 50 * time.Millisecond
	co.RetryPolicy.MaximumInterval = 200 * time.Millisecond
	return saga.Run(ctx, &saga.Opts{Key: orderKey(o.ID), Request: o, Lease: o.Lease, CompensationOptions: &co},
		func(ctx workflow.Context, s *saga.Saga) (string, error) {
			ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
				RetryPolicy: &temporal.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumAttempts: 2}})
			var out []string
			for _, name := range moneySteps {
				var r string
				if err := s.Do(ctx, saga.Step{Name: name, Activity: name, Args: []any{o}, Compensation: "undo",
					CompensationArgs: []any{name, o}}, &r); err != nil {
					return "", err
				}
				out = append(out, r)
			}
			return strings.Join(out, ","), nil
		})
}

func (m *moneyBank) register(r interface {
	RegisterWorkflowWithOptions(any, workflow.RegisterOptions)
	RegisterActivityWithOptions(any, tactivity.RegisterOptions)
}) {
	r.RegisterWorkflowWithOptions(moneyWorkflow, workflow.RegisterOptions{Name: "money"})
	for _, name := range moneySteps {
		r.RegisterActivityWithOptions(m.step(name), tactivity.RegisterOptions{Name: name})
	}
	r.RegisterActivityWithOptions(m.undo, tactivity.RegisterOptions{Name: "undo"})
}

// serverBank runs the money saga on a worker with oncekit's plugin on the shared dev
// server, on a task queue of its own.
type serverBank struct {
	*moneyBank
	c     client.Client
	queue string
}

func newServerBank(t *testing.T) *serverBank {
	t.Helper()
	srv := testsuite.StartDevServer(t)
	m := newMoneyBank(t)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: m.l})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	queue := "money-" + t.Name()
	w := tworker.New(c, queue, tworker.Options{})
	m.register(w)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return &serverBank{moneyBank: m, c: c, queue: queue}
}

func (b *serverBank) start(t *testing.T, workflowID string, o order) client.WorkflowRun {
	t.Helper()
	run, err := b.c.ExecuteWorkflow(keys.WithTenant(context.Background(), "acme"), client.StartWorkflowOptions{
		ID: workflowID, TaskQueue: b.queue, WorkflowExecutionTimeout: 3 * time.Minute}, "money", o)
	require.NoError(t, err)
	return run
}

// result waits for a run and returns its result, or its error's type ("" for success).
func result(t *testing.T, run client.WorkflowRun) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out string
	err := run.Get(ctx, &out)
	if err == nil {
		return out, ""
	}
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app, "the run ended with an error that is not an ApplicationError: %v", err)
	return out, app.Type()
}

// The compensated type, as a recorded key and a workflow's error carry it.
const compensated = policy.ErrTypeCompensated

package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/worker"
)

const activitySchema = "oncekit_bench_activity"

// activityBench runs the same workflow of 20 activities with and without the ledger
// guard on a real Temporal server, alternating, and compares end-to-end latencies.
type activityBench struct {
	url    string
	rounds int
}

type benchStep struct {
	Workflow string `json:"workflow"`
	Step     int    `json:"step"`
}

func twentyActivities(ctx workflow.Context, name string) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3}})
	id := workflow.GetInfo(ctx).WorkflowExecution.ID
	for i := range 20 {
		if err := workflow.ExecuteActivity(ctx, name, benchStep{Workflow: id, Step: i}).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

func (b activityBench) run(ctx context.Context, out io.Writer) error {
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }
	srv, err := devenv.Start(ctx, &devenv.Config{NoPostgres: true})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()

	pool, err := freshSchema(ctx, b.url, activitySchema, `CREATE TABLE steps (id bigserial PRIMARY KEY, workflow text NOT NULL, step int NOT NULL)`)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: activitySchema})
	if err != nil {
		return err
	}
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "bench"})
	if err != nil {
		return err
	}
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	if err != nil {
		return err
	}
	defer c.Close()
	queue := "bench-" + uuid.NewString()
	w := tworker.New(c, queue, tworker.Options{})
	var mu sync.Mutex
	var replays []time.Duration
	guarded := func(ctx context.Context, s benchStep) (int, error) {
		fn := func(ctx context.Context, tx pgx.Tx, _ activity.Call, s benchStep) (int, error) {
			_, err := tx.Exec(ctx, "INSERT INTO steps (workflow, step) VALUES ($1, $2)", s.Workflow, s.Step)
			return s.Step, err
		}
		n, err := activity.Do(ctx, s, fn, nil)
		if err != nil {
			return 0, err
		}
		// Measure what a retried attempt pays: the same call again is a replay.
		start := time.Now()
		if _, err := activity.Do(ctx, s, fn, nil); err != nil {
			return 0, err
		}
		mu.Lock()
		replays = append(replays, time.Since(start))
		mu.Unlock()
		return n, nil
	}
	plain := func(ctx context.Context, s benchStep) (int, error) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO steps (workflow, step) VALUES ($1, $2)", s.Workflow, s.Step)
			return err
		})
		return s.Step, err
	}
	w.RegisterWorkflowWithOptions(twentyActivities, workflow.RegisterOptions{Name: "bench.twenty"})
	w.RegisterActivityWithOptions(guarded, tactivity.RegisterOptions{Name: "bench.guarded"})
	w.RegisterActivityWithOptions(plain, tactivity.RegisterOptions{Name: "bench.plain"})
	if err := w.Start(); err != nil {
		return err
	}
	defer w.Stop()

	runOne := func(name string) func(context.Context, int) error {
		return func(ctx context.Context, _ int) error {
			run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, ID: name + "-" + uuid.NewString()}, "bench.twenty", name)
			if err != nil {
				return err
			}
			return run.Get(ctx, nil)
		}
	}
	lat, err := interleave(ctx, b.rounds, 1, 1, []scenario{{"guarded", runOne("bench.guarded")}, {"plain", runOne("bench.plain")}})
	if err != nil {
		return err
	}
	g, p := lat["guarded"]/1000, lat["plain"]/1000
	emit("activity.workflow20_guarded_ms", g)
	emit("activity.workflow20_plain_ms", p)
	emit("activity.guarded_vs_plain", g/p)
	mu.Lock()
	rs := make([]float64, len(replays))
	for i, d := range replays {
		rs[i] = float64(d.Microseconds()) / 1000
	}
	mu.Unlock()
	emit("activity.replay_ms", median(rs))
	return nil
}

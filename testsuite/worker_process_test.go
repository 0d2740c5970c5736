package testsuite_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// Environment of the crash worker process.
const (
	envTemporal = "CRASH_TEMPORAL"
	envDB       = "CRASH_DB"
	envSchema   = "CRASH_SCHEMA"
	envQueue    = "CRASH_QUEUE"
	envCrash    = "CRASH_AFTER_EFFECT" // "1": block after the effect until killed
)

// Activity names: a guarded and a plain version of a local and an external effect.
const (
	guardedLocal    = "guarded.reserve"
	plainLocal      = "plain.reserve"
	guardedExternal = "guarded.charge"
	plainExternal   = "plain.charge"
	// wrongKeyExternal is guarded by activity.External but sends a fresh key instead of
	// call.DownstreamKey: a re-drive after a crash inside the call charges again.
	wrongKeyExternal = "wrongkey.charge"
)

type order struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// effects is the schema the crash tests count in: local reservations, and the charges
// of a payment provider that honours idempotency keys.
const effectsSchema = `
	CREATE TABLE reservations (id bigserial PRIMARY KEY, order_id text NOT NULL);
	CREATE TABLE provider_charges (id bigserial PRIMARY KEY, idempotency_key text UNIQUE, order_id text NOT NULL, amount bigint NOT NULL)`

// oneActivityWorkflow runs one activity by name with a short timeout, so that a lost
// attempt is retried within seconds.
func oneActivityWorkflow(ctx workflow.Context, name string, o order) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 3 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 500 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 10},
	})
	return workflow.ExecuteActivity(ctx, name, o).Get(ctx, nil)
}

// runCrashWorker is the worker process: with CRASH_AFTER_EFFECT=1, every activity
// announces that its effect committed and waits to be killed before it can report.
func runCrashWorker(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(envSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: os.Getenv(envSchema)})
	if err != nil {
		return err
	}
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "acme"})
	if err != nil {
		return err
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv(envTemporal), Logger: devenv.QuietLogger(), Plugins: []client.Plugin{plugin}})
	if err != nil {
		return err
	}
	defer c.Close()
	crash := os.Getenv(envCrash) == "1"
	afterEffect := func(ctx context.Context, name string) {
		if crash {
			testsuite.Mark("effect " + name)
			<-ctx.Done() // the parent kills the process here
		}
	}
	w := tworker.New(c, os.Getenv(envQueue), tworker.Options{})
	w.RegisterWorkflowWithOptions(oneActivityWorkflow, workflow.RegisterOptions{Name: "crash.one"})
	w.RegisterActivityWithOptions(func(ctx context.Context, o order) (int64, error) {
		id, err := activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o order) (int64, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id) VALUES ($1) RETURNING id`, o.OrderID).Scan(&id)
			return id, err
		}, nil)
		if err == nil {
			afterEffect(ctx, guardedLocal)
		}
		return id, err
	}, tactivity.RegisterOptions{Name: guardedLocal})
	w.RegisterActivityWithOptions(func(ctx context.Context, o order) (int64, error) {
		var id int64
		err := pool.QueryRow(ctx, `INSERT INTO reservations (order_id) VALUES ($1) RETURNING id`, o.OrderID).Scan(&id)
		if err == nil {
			afterEffect(ctx, plainLocal)
		}
		return id, err
	}, tactivity.RegisterOptions{Name: plainLocal})
	w.RegisterActivityWithOptions(func(ctx context.Context, o order) (int64, error) {
		return activity.External(ctx, o, func(ctx context.Context, call activity.Call, o order) (int64, error) {
			id, err := chargeProvider(ctx, pool, string(call.DownstreamKey), o)
			if err == nil {
				afterEffect(ctx, guardedExternal) // charged; the ledger has not heard of it
			}
			return id, err
		}, nil)
	}, tactivity.RegisterOptions{Name: guardedExternal})
	w.RegisterActivityWithOptions(func(ctx context.Context, o order) (int64, error) {
		return activity.External(ctx, o, func(ctx context.Context, call activity.Call, o order) (int64, error) {
			id, err := chargeProvider(ctx, pool, uuid.NewString(), o)
			if err == nil {
				afterEffect(ctx, wrongKeyExternal)
			}
			return id, err
		}, nil)
	}, tactivity.RegisterOptions{Name: wrongKeyExternal})
	w.RegisterActivityWithOptions(func(ctx context.Context, o order) (int64, error) {
		// A fresh key per attempt: what a call without oncekit's downstream key amounts to.
		id, err := chargeProvider(ctx, pool, uuid.NewString(), o)
		if err == nil {
			afterEffect(ctx, plainExternal)
		}
		return id, err
	}, tactivity.RegisterOptions{Name: plainExternal})
	if err := w.Start(); err != nil {
		return err
	}
	testsuite.Mark("ready")
	<-ctx.Done()
	w.Stop()
	return nil
}

// chargeProvider is the payment provider: a charge with a key it has seen returns the
// first charge instead of charging again.
func chargeProvider(ctx context.Context, pool *pgxpool.Pool, idemKey string, o order) (int64, error) {
	var id int64
	err := pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO provider_charges (idempotency_key, order_id, amount) VALUES ($1, $2, $3)
			ON CONFLICT (idempotency_key) DO NOTHING RETURNING id)
		SELECT id FROM ins UNION ALL SELECT id FROM provider_charges WHERE idempotency_key = $1 LIMIT 1`,
		idemKey, o.OrderID, o.Amount).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("provider: %w", err)
	}
	return id, nil
}

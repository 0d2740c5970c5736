// Command quickstart is the README's quick start, whole: it creates oncekit's tables,
// runs a Temporal worker with oncekit's plugin, and checks out two orders through a saga
// whose steps are guarded activities. The first order is charged; the second is declined
// and its reservation released. Run it again: every step replays, and nothing is written
// twice.
//
//	DATABASE_URL=postgres://... TEMPORAL_ADDRESS=localhost:7233 go run -C samples ./quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/worker"
)

// Order is what a checkout is asked to do.
type Order struct {
	ID     string
	SKU    string
	Amount int
}

// Reserve takes the order's item from stock: a write to your own table, committed in
// the ledger's transaction, so that it happens once however often Temporal retries.
func Reserve(ctx context.Context, o Order) (string, error) {
	return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, call activity.Call, o Order) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku) VALUES ($1, $2)`, o.ID, o.SKU)
		return "reserved " + o.SKU, err
	}, nil)
}

// Release puts the item back: Reserve's compensation.
func Release(ctx context.Context, o Order) error {
	return activity.DoErr(ctx, o, func(ctx context.Context, tx pgx.Tx, call activity.Call, o Order) error {
		_, err := tx.Exec(ctx, `DELETE FROM reservations WHERE order_id = $1`, o.ID)
		return err
	}, nil)
}

// Charge records the payment, or declines an amount over 100: a definitive failure,
// stored and never retried.
func Charge(ctx context.Context, o Order) (string, error) {
	return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, call activity.Call, o Order) (string, error) {
		if o.Amount > 100 {
			return "", activity.Definitive("card_declined", fmt.Sprintf("%d is over the card's limit", o.Amount))
		}
		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount) VALUES ($1, $2)`, o.ID, o.Amount)
		return fmt.Sprintf("charged %d", o.Amount), err
	}, nil)
}

// Checkout reserves, then charges. When the charge fails, the saga releases the
// reservation. The saga is keyed by the order, so a second checkout of the same order
// replays how the first ended.
func Checkout(ctx workflow.Context, o Order) (string, error) {
	key, err := keys.Business("order", o.ID)
	if err != nil {
		return "", err
	}
	return saga.Run(ctx, &saga.Opts{Key: key, Request: o}, func(ctx workflow.Context, s *saga.Saga) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, policy.StepOptions(time.Minute))
		var reserved, charged string
		if err := s.Do(ctx, saga.Step{Name: "reserve", Activity: Reserve, Args: []any{o}, Compensation: Release}, &reserved); err != nil {
			return "", err
		}
		if err := s.Do(ctx, saga.Step{Name: "charge", Activity: Charge, Args: []any{o}}, &charged); err != nil {
			return "", err
		}
		return reserved + ", " + charged, nil
	})
}

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// oncekit's tables, in their own schema, then the business tables.
	if _, err := migrate.Up(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS reservations (order_id text PRIMARY KEY, sku text NOT NULL);
		CREATE TABLE IF NOT EXISTS payments (order_id text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	l, err := ledger.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l})
	if err != nil {
		log.Fatal(err)
	}
	// Temporal's own logs: warnings and errors, on stderr.
	logger := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	c, err := client.Dial(client.Options{HostPort: os.Getenv("TEMPORAL_ADDRESS"), Namespace: os.Getenv("TEMPORAL_NAMESPACE"),
		Logger: logger, Plugins: []client.Plugin{plugin}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w := tworker.New(c, "quickstart", tworker.Options{})
	w.RegisterWorkflow(Checkout)
	w.RegisterActivity(Reserve)
	w.RegisterActivity(Release)
	w.RegisterActivity(Charge)
	if err := w.Start(); err != nil {
		log.Fatal(err)
	}
	defer w.Stop()

	for _, o := range []Order{{ID: "order-1", SKU: "book", Amount: 30}, {ID: "order-2", SKU: "lamp", Amount: 500}} {
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: "quickstart"}, Checkout, o)
		if err != nil {
			log.Fatal(err)
		}
		var result string
		err = run.Get(ctx, &result)
		var compensated, cause *temporal.ApplicationError
		switch {
		case err == nil:
			fmt.Printf("%s: %s\n", o.ID, result)
		case errors.As(err, &compensated) && compensated.Type() == policy.ErrTypeCompensated && errors.As(compensated.Unwrap(), &cause):
			// The saga's error says what it compensated; its cause is the step's failure.
			fmt.Printf("%s: %s; %s\n", o.ID, cause.Message(), compensated.Message())
		default:
			log.Fatal(err)
		}
	}
}

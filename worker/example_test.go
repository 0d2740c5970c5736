package worker_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/worker"
)

// Inventory holds the activities of the checkout; registered as a struct, its methods
// are activities named after them ("Reserve"), and the name scopes their keys.
type Inventory struct{ pool *pgxpool.Pool }

func (i *Inventory) Reserve(ctx context.Context, orderID string) error { return nil }

func Checkout(ctx workflow.Context, orderID string) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	return workflow.ExecuteActivity(ctx, "Reserve", orderID).Get(ctx, nil)
}

// A worker main: Temporal's client.Dial and worker.New, and one line for oncekit, the
// plugin in the client's options, which every worker of the client picks up.
func ExampleNewPlugin() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
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
	c, err := client.Dial(client.Options{HostPort: os.Getenv("TEMPORAL_ADDRESS"), Plugins: []client.Plugin{plugin}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w := tworker.New(c, "checkout", tworker.Options{})
	w.RegisterWorkflow(Checkout)
	w.RegisterActivity(&Inventory{pool: pool})
	err = w.Run(tworker.InterruptCh()) // until SIGINT or SIGTERM
	if err != nil {
		log.Fatal(err)
	}
}

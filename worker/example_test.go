package worker_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/worker"
)

func reserveInventory(ctx context.Context, orderID string) error { return nil }

func checkoutWorkflow() {}

// A worker main: the ledger, a client with tenant propagation, and activities under
// explicit names. Only oncekit's worker package is imported for the worker itself.
func ExampleNew() {
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
	c, err := worker.Dial(ctx, client.Options{HostPort: os.Getenv("TEMPORAL_ADDRESS")})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	w, err := worker.New(c, "checkout", l, nil)
	if err != nil {
		log.Fatal(err)
	}
	w.RegisterWorkflow("checkout", checkoutWorkflow)
	w.RegisterActivity("inventory.reserve", reserveInventory)
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatal(err)
	}
}

// Command worker runs the money transfer's workflow and activities, with oncekit's plugin
// and a ledger in the PostgreSQL database at DATABASE_URL (which also holds the sample's
// bank).
package main

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/samples/transfer"
	"github.com/oncekit/oncekit/worker"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatalln("cannot open the database:", err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		log.Fatalln("cannot migrate the ledger:", err)
	}
	l, err := ledger.New(pool, nil)
	if err != nil {
		log.Fatalln("cannot create the ledger:", err)
	}
	bank, err := openSandboxBank(ctx, pool)
	if err != nil {
		log.Fatalln("cannot open the bank:", err)
	}
	transfer.UseBank(bank)

	// oncekit's plugin: the ledger in every activity's context, and the saga's records.
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l})
	if err != nil {
		log.Fatalln("cannot create oncekit's plugin:", err)
	}
	// One client per process, as usual; the plugin rides on it.
	c, err := client.Dial(client.Options{Plugins: []client.Plugin{plugin}})
	if err != nil {
		log.Fatalln("cannot dial Temporal:", err)
	}
	defer c.Close()
	// Workflow and activities on one worker.
	w := tworker.New(c, transfer.TransferMoneyTaskQueue, tworker.Options{})
	w.RegisterWorkflow(transfer.TransferMoney)
	w.RegisterActivity(transfer.Withdraw)
	w.RegisterActivity(transfer.WithdrawCompensation)
	w.RegisterActivity(transfer.Deposit)
	w.RegisterActivity(transfer.DepositCompensation)
	w.RegisterActivity(transfer.StepWithError)
	// Poll the task queue until interrupted.
	if err := w.Run(tworker.InterruptCh()); err != nil {
		log.Fatalln("the worker stopped:", err)
	}
}

// openSandboxBank creates the sample's bank and the two accounts the starter uses.
func openSandboxBank(ctx context.Context, pool *pgxpool.Pool) (*transfer.Bank, error) {
	if _, err := pool.Exec(ctx, transfer.BankSchema); err != nil {
		return nil, err
	}
	b := &transfer.Bank{Pool: pool}
	for _, account := range []string{"001-001", "002-002"} {
		if err := b.Open(ctx, account, 1000); err != nil {
			return nil, err
		}
	}
	return b, nil
}

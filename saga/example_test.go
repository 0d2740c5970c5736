package saga_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
)

// Transfer withdraws, deposits and notifies; each movement has a compensation. The
// saga is keyed by the transfer's ID, so its outcome belongs to the transfer.
func Transfer(ctx workflow.Context, id string) (string, error) {
	key, err := keys.Business("transfer", id)
	if err != nil {
		return "", err
	}
	return saga.Run(ctx, &saga.Opts{Key: key, Request: id}, func(ctx workflow.Context, s *saga.Saga) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, policy.StepOptions(time.Minute))
		for _, st := range []saga.Step{
			{Name: "withdraw", Activity: "withdraw", Args: []any{id}, Compensation: "refund"},
			{Name: "deposit", Activity: "deposit", Args: []any{id}, Compensation: "reverse"},
			{Name: "notify", Activity: "notify", Args: []any{id}},
		} {
			if err := s.Do(ctx, st, nil); err != nil {
				return "", err // Run compensates: reverse order, or all at once with Opts.Parallel
			}
		}
		return "transferred", nil
	})
}

// The notification fails, so the saga compensates. A second workflow for the same
// transfer, once the notification works again, runs nothing and ends as the first did.
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	l, err := ledger.New(pool, nil)
	if err != nil {
		panic(err)
	}
	notifyDown := true
	step := func(name string) func(context.Context, string) error {
		return func(ctx context.Context, id string) error {
			fmt.Println("  ran", name)
			if name == "notify" && notifyDown {
				return temporal.NewNonRetryableApplicationError("the notification service refused", "NotifyRefused", nil)
			}
			return nil
		}
	}
	id := fmt.Sprintf("t-%d", time.Now().UnixNano())
	for i, wf := range []string{"transfer-1", "transfer-2"} {
		fmt.Printf("workflow %d:\n", i+1)
		env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Tenant: "acme"})
		env.RegisterWorkflowWithOptions(Transfer, workflow.RegisterOptions{Name: "transfer"})
		for _, name := range []string{"withdraw", "deposit", "notify", "refund", "reverse"} {
			env.RegisterActivityWithOptions(step(name), tactivity.RegisterOptions{Name: name})
		}
		env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: wf})
		env.ExecuteWorkflow("transfer", id)
		var app *temporal.ApplicationError
		if errors.As(env.GetWorkflowError(), &app) {
			fmt.Println("  ended:", app.Type())
		}
		notifyDown = false
	}
	// Output:
	// workflow 1:
	//   ran withdraw
	//   ran deposit
	//   ran notify
	//   ran reverse
	//   ran refund
	//   ended: oncekit.saga.Compensated
	// workflow 2:
	//   ended: oncekit.saga.Compensated
}

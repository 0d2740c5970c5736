package activity_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
)

type Reserve struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
}

// reserve is an activity whose database write is guarded: the write and the ledger
// record commit together.
func reserve(ctx context.Context, req Reserve) (string, error) {
	return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req Reserve) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO example_reservations (order_id, sku) VALUES ($1, $2)`, req.OrderID, req.SKU)
		return "reserved " + req.SKU, err
	}, nil)
}

// Guard an activity's database write: the write and the ledger record commit together,
// and a retried attempt replays the result. Here the first attempt is crashed after its
// write, as if its worker died before reporting; the retry inserts nothing.
func ExampleDo() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_reservations (order_id text NOT NULL, sku text NOT NULL)`)
	l, _ := ledger.New(pool, nil)

	checkout := func(ctx workflow.Context, req Reserve) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, policy.ActivityOptions(time.Minute))
		var out string
		err := workflow.ExecuteActivity(ctx, "inventory.reserve", req).Get(ctx, &out)
		return out, err
	}

	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{
		Ledger: l,
		Faults: testsuite.NewFaultPlan().CrashAfterEffect("inventory.reserve"),
	})
	env.RegisterActivityWithOptions(reserve, tactivity.RegisterOptions{Name: "inventory.reserve"})
	env.RegisterWorkflowWithOptions(checkout, workflow.RegisterOptions{Name: "checkout"})
	req := Reserve{OrderID: uuid.NewString(), SKU: "book"}
	env.ExecuteWorkflow("checkout", req)

	var out string
	_ = env.GetWorkflowResult(&out)
	n, _ := testsuite.Count(ctx, pool, `SELECT count(*) FROM example_reservations WHERE order_id = $1`, req.OrderID)
	fmt.Println(out)
	fmt.Println("reservations:", n)
	// Output:
	// reserved book
	// reservations: 1
}

// The crash test the README asks for, for each activity: ExampleDo's reserve, crashed at
// every point it reaches, has its effect once.
func TestReserveOnce(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE example_reservations (order_id text NOT NULL, sku text NOT NULL)`)
	require.NoError(t, err)
	testsuite.CheckCrashBeforeComplete(t, testsuite.Case[Reserve]{
		Name: "inventory.reserve", Activity: reserve, Request: Reserve{OrderID: "o-1", SKU: "book"}, Ledger: l,
		Effects: func(ctx context.Context) (int, error) {
			return testsuite.Count(ctx, pool, `SELECT count(*) FROM example_reservations WHERE order_id = 'o-1'`)
		},
	})
}

package activity_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/testsuite"
)

// paymentProvider stands in for a payment API that honours an Idempotency-Key header.
type paymentProvider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key → charge ID
	lose    bool              // lose the next response after charging
}

func (p *paymentProvider) Charge(idempotencyKey string, amount int64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, seen := p.charges[idempotencyKey]
	if !seen {
		id = fmt.Sprintf("ch_%d", len(p.charges)+1)
		p.charges[idempotencyKey] = id
	}
	if p.lose {
		p.lose = false
		return "", errors.New("read: connection reset by peer") // charged, but the answer is lost
	}
	return id, nil
}

type Charge struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// Call a payment API exactly once: send the downstream key as the provider's
// idempotency key. The first attempt's answer is lost after the provider charged; the
// retry calls again with the same key and the provider returns the same charge.
func ExampleExternal() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	l, _ := ledger.New(pool, nil)
	provider := &paymentProvider{charges: map[string]string{}, lose: true}

	chargeCard := func(ctx context.Context, req Charge) (string, error) {
		return activity.External(ctx, req, func(ctx context.Context, call activity.Call, req Charge) (string, error) {
			return provider.Charge(string(call.DownstreamKey), req.Amount)
		}, nil)
	}
	pay := func(ctx workflow.Context, req Charge) (string, error) {
		ctx = workflow.WithActivityOptions(ctx, policy.ActivityOptions(time.Minute))
		var chargeID string
		err := workflow.ExecuteActivity(ctx, "payments.charge", req).Get(ctx, &chargeID)
		return chargeID, err
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(chargeCard, tactivity.RegisterOptions{Name: "payments.charge"})
	env.RegisterWorkflowWithOptions(pay, workflow.RegisterOptions{Name: "pay"})
	env.ExecuteWorkflow("pay", Charge{OrderID: "order-42", Amount: 4200})

	var chargeID string
	_ = env.GetWorkflowResult(&chargeID)
	fmt.Println("charge:", chargeID)
	fmt.Println("charges at the provider:", len(provider.charges))
	// Output:
	// charge: ch_1
	// charges at the provider: 1
}

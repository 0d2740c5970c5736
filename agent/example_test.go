package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// An agent claims a ticket, sends an email through an API that takes an
// Idempotency-Key, and finishes. A redelivered ticket replays the email's output, and a
// retry whose model chose another address is refused.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, ""); err != nil {
		panic(err)
	}
	l, _ := ledger.New(pool, nil)
	g, _ := agent.New(l, nil)

	sendEmail := agent.Tool{Name: "send_email", AcceptsKey: true}
	sent := 0
	send := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		sent++ // stands in for POST /emails with Idempotency-Key: inv.DownstreamKey
		return json.RawMessage(`{"id":"em_1"}`), nil
	}

	ticket := "ticket-" + uuid.NewString()
	task, err := g.ClaimTask(ctx, "acme", ticket, nil)
	if err != nil {
		panic(err)
	}
	args := json.RawMessage(`{"to":"ann@example.com","subject":"Your refund"}`)
	for range 2 { // the second pass stands in for a redelivery
		res, err := task.Call(ctx, "1", sendEmail, args, send, nil)
		if err != nil {
			panic(err)
		}
		fmt.Println(string(res.Output), "replayed:", res.Replayed)
	}
	_, err = task.Call(ctx, "1", sendEmail, json.RawMessage(`{"to":"bob@example.com","subject":"Your refund"}`), send, nil)
	fmt.Println("changed arguments refused:", errors.Is(err, agent.ErrArgumentsChanged))
	if err := task.Finish(ctx, json.RawMessage(`{"status":"solved"}`)); err != nil {
		panic(err)
	}
	fmt.Println("emails sent:", sent)
	// Output:
	// {"id":"em_1"} replayed: false
	// {"id":"em_1"} replayed: true
	// changed arguments refused: true
	// emails sent: 1
}

package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// decision is what a model answers: a tool to call with arguments, or done.
type decision struct {
	Tool string
	Args json.RawMessage
}

// A polling agent's loop: claim a task, ask the model, make each tool call at its step,
// and hand the model what came back, refusals included. The loop runs twice over the
// same ticket, as after a crash and a redelivery; on the second pass the model changes
// its mind about the email, and the changed call is refused instead of sent.
func Example_loop() {
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

	tools := map[string]agent.Tool{
		"send_email": {Name: "send_email", AcceptsKey: true},
		"refund":     {Name: "refund", AcceptsKey: true},
	}
	effects := map[string]int{}
	run := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		effects[inv.Call.Tool]++ // the provider's API, sent inv.DownstreamKey
		return json.RawMessage(`{"ok":true}`), nil
	}
	pass := 0
	model := func(history []string) decision { // stands in for the model
		switch len(history) {
		case 0:
			return decision{"refund", json.RawMessage(`{"charge":"ch_1","amount":500}`)}
		case 1:
			to := "ann@example.com"
			if pass == 2 {
				to = "ann.b@example.com" // a retried model chooses otherwise
			}
			return decision{"send_email", json.RawMessage(`{"to":"` + to + `"}`)}
		}
		return decision{}
	}

	ticket := "ticket-" + uuid.NewString()
	for pass = 1; pass <= 2; pass++ {
		task, err := g.ClaimTask(ctx, "acme", ticket, nil)
		if err != nil {
			panic(err)
		}
		var history []string
		for step := 1; ; step++ {
			d := model(history)
			if d.Tool == "" {
				break
			}
			res, err := task.Call(ctx, strconv.Itoa(step), tools[d.Tool], d.Args, run, nil)
			var changed *agent.ArgumentsChangedError
			switch {
			case errors.As(err, &changed):
				history = append(history, "refused: already done with "+string(changed.Stored))
			case errors.Is(err, agent.ErrUncertain):
				history = append(history, "uncertain: escalated to a person")
			case err != nil:
				panic(err)
			default:
				history = append(history, string(res.Output))
			}
		}
		fmt.Println("pass", pass, history)
		if pass == 1 {
			_ = task.Release(ctx) // the first agent dies without finishing
			continue
		}
		_ = task.Finish(ctx, nil)
	}
	fmt.Println("refunds:", effects["refund"], "emails:", effects["send_email"])
	// Output:
	// pass 1 [{"ok":true} {"ok":true}]
	// pass 2 [{"ok":true} refused: already done with {"to":"ann@example.com"}]
	// refunds: 1 emails: 1
}

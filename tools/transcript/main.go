// Command transcript produces the transcript of the oncekit command that
// docs/operating.md shows: it starts a throwaway PostgreSQL, records a few intents (a
// claim left stuck, one whose lease is live, activity keys of a workflow run, its saga's
// key), a dead outbox event and an inbox message, builds the command from its module and runs it, printing each command
// line and its real output.
//
//	go run ./tools/transcript
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true})
	must(err)
	defer env.Close()
	pool, err := pgxpool.New(ctx, env.DatabaseURL)
	must(err)
	_, err = migrate.Up(ctx, pool, "")
	must(err)
	l, err := ledger.New(pool, nil)
	must(err)
	in := func(tenant, op, key string) ledger.Intent {
		fp, _ := keys.FingerprintJSON(key)
		return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Key(key), Fingerprint: fp}
	}
	for i := range 3 {
		_, err = l.Do(ctx, in("shop", "orders.create", fmt.Sprintf("order-%d", i)), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Code: 201, Body: []byte(fmt.Sprintf(`{"order":"order-%d","status":"created"}`, i))}, nil
		}, nil)
		must(err)
	}
	// A payment activity's claims, keyed by its workflow run and activity ID: one whose
	// worker died (its lease runs out below), one still running.
	// Each carries the origin oncekit's worker plugin puts in an activity's context.
	run := "0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44"
	charge := ledger.WithOrigin(ctx, ledger.Origin{WorkflowID: "order-1", RunID: run, WorkflowType: "Order", ActivityType: "payments.charge"})
	_, err = l.Claim(charge, in("shop", "payments.charge", string(keys.Run(run, "5"))), &ledger.ClaimOpts{Lease: 2 * time.Second})
	must(err)
	_, err = l.Claim(charge, in("shop", "payments.charge", string(keys.Run(run, "9"))), &ledger.ClaimOpts{Lease: time.Hour})
	must(err)
	// The saga of workflow order-1, running in that run: its default key holds the
	// workflow ID and the run ID.
	sagaKey, err := keys.Business("saga", "order-1", run)
	must(err)
	begin := ledger.WithOrigin(ctx, ledger.Origin{WorkflowID: "order-1", RunID: run, WorkflowType: "Order", ActivityType: "oncekit.saga.Begin"})
	_, err = l.Claim(begin, in("shop", "oncekit.saga", string(sagaKey)), &ledger.ClaimOpts{Lease: time.Hour})
	must(err)
	// A message the billing consumer handled.
	ib, err := inbox.New(pool, nil)
	must(err)
	_, err = ib.Handle(ctx, "billing", "msg-8f14e45f", func(context.Context, pgx.Tx) error { return nil })
	must(err)
	// An event the broker refused for good: dead until an operator retries it.
	out, err := outbox.New(pool, nil)
	must(err)
	var deadID string
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "payments.captured", Payload: []byte(`{"order":"order-1","amount":4200}`)})
		if err == nil {
			deadID = ids[0].String()
		}
		return err
	}))
	refuse := outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		return fmt.Errorf("broker: topic payments.captured: schema rejected: %w", outbox.ErrPermanent)
	})
	d, err := outbox.NewDispatcher(out, refuse, nil)
	must(err)
	_, err = d.Drain(ctx)
	must(err)
	time.Sleep(2100 * time.Millisecond) // the short lease runs out, as a dead worker's does

	dir, err := os.MkdirTemp("", "oncekit-transcript-")
	must(err)
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "oncekit")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("cmd", "oncekit")
	build.Stderr = os.Stderr
	must(build.Run())
	stuck, live := string(keys.Run(run, "5")), string(keys.Run(run, "9"))
	for _, args := range [][]string{
		{"status"},
		{"list", "--workflow-id", "order-1"},
		{"list", "--workflow-id", "order-1", "--activity-type", "payments.charge"},
		{"inspect", "shop", "payments.charge", stuck},
		{"release", "shop", "payments.charge", live},
		{"release", "shop", "payments.charge", stuck},
		{"release", "shop", "payments.charge", stuck, "-y", "--reason", "INC-311: worker host lost", "--actor", "alice"},
		{"inspect", "shop", "payments.charge", stuck},
		{"outbox", "dead"},
		{"outbox", "retry", deadID},
		{"outbox", "retry", deadID, "--reason", "INC-312: broker schema fixed", "--actor", "alice"},
		{"audit"},
		{"inbox", "show", "billing", "msg-8f14e45f"},
		{"purge", "--dry-run"},
		{"migrate", "status"},
	} {
		fmt.Printf("$ oncekit %s\n", shellQuote(args))
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+env.DatabaseURL)
		out, err := cmd.CombinedOutput()
		fmt.Print(string(out))
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			fmt.Printf("$ echo $?\n%d\n", ee.ExitCode())
		}
		fmt.Println()
	}
}

// shellQuote joins args as a shell would read them back.
func shellQuote(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " :'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

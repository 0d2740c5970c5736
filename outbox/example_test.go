package outbox_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

// Enqueue an event with the business write, dispatch it, and consume it through an
// inbox keyed by the event ID. The dispatcher publishes the event twice here, as one
// that died before marking it would; the consumer's effect happens once.
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
	_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_ledger_lines (event_id uuid NOT NULL)`)
	out, _ := outbox.New(pool, nil)
	in, _ := inbox.New(pool, nil)

	// Producer, in the business transaction:
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "payments.captured", Payload: []byte(`{"amount":4200}`)})
		return err
	})
	if err != nil {
		panic(err)
	}

	// Consumer: one effect per event ID.
	handled := 0
	consume := func(ctx context.Context, e outbox.Event) error {
		res, err := in.Handle(ctx, "ledger-lines", e.ID.String(), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO example_ledger_lines (event_id) VALUES ($1)`, e.ID)
			return err
		})
		if err == nil && !res.Duplicate {
			handled++
		}
		return err
	}
	twice := outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		if err := consume(ctx, e); err != nil {
			return err
		}
		return consume(ctx, e) // at least once: a second delivery of the same event
	})
	// Dispatcher: outbox.HTTPPublisher, outboxtemporal.NewPublisher, or your own.
	d, _ := outbox.NewDispatcher(out, twice, nil)
	if _, err := d.Drain(ctx); err != nil {
		panic(err)
	}
	fmt.Println("effects:", handled)
	// Output: effects: 1
}

package inbox_test

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/migrate"
)

// A consumer handles a message in its inbox: the handler's writes and the record of
// the message commit together, so a redelivery is recognised and acked without running
// the handler again.
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
	in, err := inbox.New(pool, nil)
	if err != nil {
		panic(err)
	}
	messageID := uuid.NewString() // the broker's message ID
	book := func(ctx context.Context, tx pgx.Tx) error {
		fmt.Println("booking the payment")
		return nil // write through tx
	}
	for range 2 { // the broker delivers it twice
		res, err := in.Handle(ctx, "ledger-lines", messageID, book)
		if err != nil {
			panic(err) // not recorded: the broker redelivers
		}
		fmt.Println("duplicate:", res.Duplicate)
	}
	// Output:
	// booking the payment
	// duplicate: false
	// duplicate: true
}

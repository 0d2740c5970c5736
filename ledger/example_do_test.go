package ledger_test

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Run a mutation once per intent: the retry replays the stored response, byte for byte,
// and inserts nothing.
func ExampleLedger_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (id uuid PRIMARY KEY, item text NOT NULL)`); err != nil {
		panic(err)
	}
	l, err := ledger.New(pool, nil)
	if err != nil {
		panic(err)
	}

	orderID := uuid.New() // in real code: the client's Idempotency-Key or an order ID
	req := map[string]any{"item": "book"}
	fp, _ := keys.FingerprintJSON(req)
	in := ledger.Intent{
		Scope:       keys.Scope{Tenant: "acme", Operation: "orders.create"},
		Key:         keys.Key(orderID.String()),
		Fingerprint: fp,
	}
	create := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO example_orders (id, item) VALUES ($1, $2)`, orderID, "book"); err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{Code: 201, Body: []byte(`{"status":"created"}`)}, nil
	}

	for range 2 {
		res, err := l.Do(ctx, in, create, nil) // res.Replayed on a retry: the stored body, and nothing ran
		if err != nil {
			panic(err)
		}
		fmt.Printf("replayed=%v code=%d body=%s\n", res.Replayed, res.Code, res.Body)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM example_orders WHERE id = $1`, orderID).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// replayed=false code=201 body={"status":"created"}
	// replayed=true code=201 body={"status":"created"}
	// orders: 1
}

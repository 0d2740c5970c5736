package ledger_test

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Run a single-statement mutation once per intent, in one round trip: the statement's
// rows are the stored response, and the retry replays them without running it.
func ExampleLedger_DoStatement() {
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
	fp, _ := keys.FingerprintJSON(map[string]any{"item": "book"})
	in := ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "orders.create"}, Key: keys.Key(orderID.String()), Fingerprint: fp}
	st := ledger.Statement{
		SQL:  `INSERT INTO example_orders (id, item) VALUES ($1, $2) RETURNING item`,
		Args: []any{orderID, "book"},
		Code: 201,
	}
	for range 2 {
		res, err := l.DoStatement(ctx, in, st, nil) // res.Response.Body: [{"item":"book"}]
		if err != nil {
			panic(err)
		}
		fmt.Printf("replayed=%v code=%d body=%s\n", res.Replayed, res.Code, res.Body)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM example_orders WHERE id = $1`, orderID).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// replayed=false code=201 body=[{"item":"book"}]
	// replayed=true code=201 body=[{"item":"book"}]
	// orders: 1
}

package testsuite_test

import (
	"context"
	"fmt"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

type Ship struct {
	OrderID string `json:"order_id"`
}

// Write the crash test for your own activity. In a test, call
// testsuite.CheckCrashBeforeComplete(t, c) with the same Case: it fails the test when the
// effect happens twice or the retry answers differently. RunCrashBeforeComplete returns
// what it saw instead; here for a guarded activity and for the same activity without the
// guard.
func ExampleRunCrashBeforeComplete() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_shipments (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	l, _ := ledger.New(pool, nil)

	insertShipment := func(ctx context.Context, db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, orderID string) (int64, error) {
		var id int64
		err := db.QueryRow(ctx, `INSERT INTO example_shipments (order_id) VALUES ($1) RETURNING id`, orderID).Scan(&id)
		return id, err
	}
	guarded := func(ctx context.Context, req Ship) (int64, error) {
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, _ activity.Call, req Ship) (int64, error) {
			return insertShipment(ctx, tx, req.OrderID)
		}, nil)
	}
	plain := func(ctx context.Context, req Ship) (int64, error) { return insertShipment(ctx, pool, req.OrderID) }

	for _, act := range []struct {
		name string
		fn   func(context.Context, Ship) (int64, error)
	}{{"shipping.create", guarded}, {"shipping.create-plain", plain}} {
		req := Ship{OrderID: uuid.NewString()}
		rep, err := testsuite.RunCrashBeforeComplete(testsuite.Case[Ship]{
			Name: act.name, Activity: act.fn, Request: req, Ledger: l,
			Effects: func(ctx context.Context) (int, error) {
				return testsuite.Count(ctx, pool, `SELECT count(*) FROM example_shipments WHERE order_id = $1`, req.OrderID)
			},
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: effects=%d same result=%v\n", act.name, rep.Effects, rep.SameResult())
	}
	// Output:
	// shipping.create: effects=1 same result=true
	// shipping.create-plain: effects=2 same result=false
}

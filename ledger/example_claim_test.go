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

// Guard a call outside the database, such as a payment API: claim before the call,
// complete after it, and send the provider a key derived from the intent's key.
func ExampleLedger_Claim() {
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

	key, _ := keys.Business("order-"+uuid.NewString(), "charge")
	fp, _ := keys.FingerprintJSON(map[string]any{"amount": 4200, "currency": "EUR"})
	in := ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "payments.charge"}, Key: key, Fingerprint: fp}

	charges := 0
	chargeCard := func(idempotencyKey keys.Key) []byte { // stands in for the provider
		charges++
		return []byte(`{"charge":"ch_1"}`)
	}
	for attempt := 1; attempt <= 2; attempt++ {
		c, err := l.Claim(ctx, in, nil)
		if err != nil {
			panic(err)
		}
		if c.Lease == nil {
			fmt.Printf("attempt %d: replayed %s\n", attempt, c.Result.Body)
			continue
		}
		downstream, _ := keys.Derive(in.Key, "provider-charge")
		body := chargeCard(downstream)
		if _, err := l.Complete(ctx, c.Lease, ledger.Response{Code: 200, Body: body}); err != nil {
			panic(err)
		}
		fmt.Printf("attempt %d: charged %s\n", attempt, body)
	}
	fmt.Println("charges:", charges)
	// Output:
	// attempt 1: charged {"charge":"ch_1"}
	// attempt 2: replayed {"charge":"ch_1"}
	// charges: 1
}

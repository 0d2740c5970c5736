package shard_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/shard"
)

// Two clusters, a tenant placed on each by name and the rest by hash: the ledger, the
// inbox and the outbox on the router, a dispatcher per shard. It needs the two
// databases, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	eu, err := pgxpool.New(ctx, os.Getenv("EU_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	us, err := pgxpool.New(ctx, os.Getenv("US_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	r, err := shard.New([]shard.Shard{{Name: "eu", Pool: eu}, {Name: "us", Pool: us}},
		shard.Map(map[string]string{"acme": "eu", "globex": "us"}, shard.Hash("eu", "us")))
	if err != nil {
		panic(err)
	}
	if _, err := migrate.UpShards(ctx, r, ""); err != nil {
		panic(err)
	}

	l, err := ledger.NewSharded(r, nil)
	if err != nil {
		panic(err)
	}
	ib, err := inbox.NewSharded(r, nil)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.NewSharded(r, nil)
	if err != nil {
		panic(err)
	}
	for _, s := range r.Shards() {
		so, _ := ob.Shard(s.Name)
		d, err := outbox.NewDispatcher(so, outbox.PublisherFunc(publish), nil)
		if err != nil {
			panic(err)
		}
		go func() { _ = d.Run(ctx) }()
	}

	// Do runs on acme's shard: the claim, the business write and the record commit there.
	fp, _ := keys.FingerprintJSON(map[string]int{"amount": 4200})
	in := ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "orders.create"}, Key: "order-1", Fingerprint: fp}
	_, err = l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, err := tx.Exec(ctx, `INSERT INTO orders (tenant, id, amount) VALUES ('acme', 1, 4200)`)
		if err == nil {
			_, err = ob.Enqueue(ctx, tx, outbox.Event{Topic: "orders", Payload: []byte(`{"id":1}`)})
		}
		return ledger.Response{Code: 201}, err
	}, nil)
	if err != nil {
		panic(err)
	}

	// The inbox records a message on the shard of the tenant in the context.
	_, err = ib.Handle(keys.WithTenant(ctx, "globex"), "billing", "msg-1", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET credited = true WHERE tenant = 'globex'`)
		return err
	})
	if err != nil {
		panic(err)
	}
}

func publish(context.Context, outbox.Event) error { return nil }

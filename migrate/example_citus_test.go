package migrate_test

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// On a Citus coordinator, colocate oncekit's tables with a business table distributed
// by tenant, so that a guarded call on one tenant runs on one worker. It needs a Citus
// cluster (make test-citus runs it on one), so it is compiled but not run here.
func ExampleDistribute() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, ""); err != nil {
		panic(err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.orders (tenant text NOT NULL, id bigint NOT NULL, amount bigint NOT NULL, PRIMARY KEY (tenant, id));
		SELECT create_distributed_table('public.orders', 'tenant', colocate_with => 'none')
		WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'public.orders'::regclass)`)
	if err != nil {
		panic(err)
	}
	_, err = migrate.Distribute(ctx, pool, "", &migrate.DistributeOpts{ColocateWith: "public.orders"})
	if err != nil {
		panic(err)
	}

	l, _ := ledger.New(pool, nil)
	tenant, id, amount := "acme", int64(1), int64(4200)
	fp, _ := keys.FingerprintJSON(map[string]int64{"id": id, "amount": amount})
	in := ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: "orders.create"}, Key: "order-1", Fingerprint: fp}
	res, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		_, err := tx.Exec(ctx, `INSERT INTO orders (tenant, id, amount) VALUES ($1, $2, $3)`, tenant, id, amount)
		return ledger.Response{Code: 201}, err
	}, nil)
	if err != nil {
		panic(err)
	}
	_ = res.Replayed
}

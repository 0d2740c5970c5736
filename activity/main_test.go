package activity_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup migrates a ledger into a fresh schema with the tables the activities below use.
func setup(t *testing.T) (*ledger.Ledger, *pgxpool.Pool) {
	t.Helper()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(ledger.Migrate), `
		CREATE TABLE reservations (id bigserial PRIMARY KEY, order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL);
		CREATE TABLE provider_charges (id bigserial PRIMARY KEY, idempotency_key text UNIQUE, order_id text NOT NULL, amount bigint NOT NULL)`)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	return l, pool
}

type reserveReq struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

type reservation struct {
	ReservationID int64  `json:"reservation_id"`
	Key           string `json:"key"`
}

// reserveOrder is a guarded local side effect: it writes in the ledger's transaction.
func reserveOrder(ctx context.Context, req reserveReq) (reservation, error) {
	return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3) RETURNING id`,
			req.OrderID, req.SKU, req.Qty).Scan(&id)
		return reservation{ReservationID: id, Key: string(call.Key)}, err
	}, nil)
}

// reserveByOrder is reserveOrder under a business key: order ID and step.
func reserveByOrder(ctx context.Context, req reserveReq) (reservation, error) {
	key, err := keys.Business(req.OrderID, "reserve")
	if err != nil {
		return reservation{}, err
	}
	return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, call activity.Call, req reserveReq) (reservation, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3) RETURNING id`,
			req.OrderID, req.SKU, req.Qty).Scan(&id)
		return reservation{ReservationID: id, Key: string(call.Key)}, err
	}, &activity.Opts{Key: key})
}

// plainReserve is the same effect without oncekit.
func plainReserve(pool *pgxpool.Pool) func(ctx context.Context, req reserveReq) (reservation, error) {
	return func(ctx context.Context, req reserveReq) (reservation, error) {
		var id int64
		err := pool.QueryRow(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3) RETURNING id`,
			req.OrderID, req.SKU, req.Qty).Scan(&id)
		return reservation{ReservationID: id}, err
	}
}

type chargeReq struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

type charge struct {
	ChargeID int64 `json:"charge_id"`
}

// provider stands in for a payment provider that honours idempotency keys: a call
// with a key it has seen returns the first charge.
func providerCharge(ctx context.Context, pool *pgxpool.Pool, idemKey, orderID string, amount int64) (int64, error) {
	var id int64
	err := pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO provider_charges (idempotency_key, order_id, amount) VALUES ($1, $2, $3)
			ON CONFLICT (idempotency_key) DO NOTHING RETURNING id)
		SELECT id FROM ins UNION ALL SELECT id FROM provider_charges WHERE idempotency_key = $1 LIMIT 1`,
		idemKey, orderID, amount).Scan(&id)
	return id, err
}

func countWhere(ctx context.Context, pool *pgxpool.Pool, table, orderID string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE order_id = $1", orderID).Scan(&n)
	return n, err
}

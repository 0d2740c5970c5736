package transfer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BankSchema creates the bank's tables: accounts, and the movements of money, each under
// an optional idempotency key.
const BankSchema = `
	CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
	CREATE TABLE movements (id bigserial PRIMARY KEY, idempotency_key text UNIQUE, account text NOT NULL,
		amount bigint NOT NULL, reference text NOT NULL)`

// Bank is the bank's API, the external service both versions call. Like a real payment
// API it honours idempotency keys: a movement with a key it has seen moves nothing and
// answers the first movement's ID. A movement without a key always moves money.
type Bank struct {
	Pool *pgxpool.Pool
}

// Open creates an account with balance.
func (b *Bank) Open(ctx context.Context, account string, balance int64) error {
	_, err := b.Pool.Exec(ctx, `INSERT INTO accounts (id, balance) VALUES ($1, $2)`, account, balance)
	return err
}

// Move adds amount (negative to withdraw) to account, once per idempotency key, and
// returns the movement's ID. An empty key moves every time.
func (b *Bank) Move(ctx context.Context, idempotencyKey, account string, amount int64, reference string) (int64, error) {
	var key *string
	if idempotencyKey != "" {
		key = &idempotencyKey
	}
	var id int64
	err := b.Pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO movements (idempotency_key, account, amount, reference) VALUES ($1, $2, $3, $4)
			ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, account, amount),
		upd AS (UPDATE accounts SET balance = balance + ins.amount FROM ins WHERE accounts.id = ins.account)
		SELECT id FROM ins UNION ALL SELECT id FROM movements WHERE idempotency_key = $1 LIMIT 1`,
		key, account, amount, reference).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("bank: move %d on %s: %w", amount, account, err)
	}
	return id, nil
}

// Balance returns the balance of account.
func (b *Bank) Balance(ctx context.Context, account string) (int64, error) {
	var n int64
	err := b.Pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1`, account).Scan(&n)
	return n, err
}

// Movements counts the movements of a transfer.
func (b *Bank) Movements(ctx context.Context, reference string) (int, error) {
	var n int
	err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM movements WHERE reference = $1`, reference).Scan(&n)
	return n, err
}

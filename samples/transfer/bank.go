package transfer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Bank stands in for the bank's API: the external service whose money the transfer
// moves, kept in PostgreSQL so the money can be counted. Like a real payment API it
// honours idempotency keys: a movement under a key it has seen moves nothing and answers
// the first movement's ID. A movement without a key always moves money.
type Bank struct {
	Pool *pgxpool.Pool
	// FaultFunc, when set, makes each movement by calling move: it may fail without
	// calling it (the bank is unreachable), or call it and fail after (the answer is lost
	// on the way back). Tests inject faults here, and stop or kill a worker.
	FaultFunc func(ctx context.Context, m Movement, move func(context.Context) (int64, error)) (int64, error)
	// RefuseFunc says whether StepWithError fails for a transfer. Nil refuses every
	// transfer, as the samples-go step does.
	RefuseFunc func(d TransferDetails) bool
}

// Movement is one movement of money on an account.
type Movement struct {
	// IdempotencyKey deduplicates the movement at the bank; empty moves every time.
	IdempotencyKey string
	Account        string
	// Amount is added to the account: negative takes money out.
	Amount float32
	// Reference is the transfer's ReferenceID, and Kind what the movement is for
	// ("withdraw", "deposit", "withdraw-compensation", "deposit-compensation").
	Reference string
	Kind      string
}

// BankSchema creates the bank's tables: accounts and the movements on them, each under
// an optional idempotency key. Amounts are kept in cents.
const BankSchema = `
	CREATE TABLE IF NOT EXISTS bank_accounts (id text PRIMARY KEY, balance_cents bigint NOT NULL);
	CREATE TABLE IF NOT EXISTS bank_movements (id bigserial PRIMARY KEY, idempotency_key text UNIQUE,
		account text NOT NULL, amount_cents bigint NOT NULL, reference text NOT NULL, kind text NOT NULL)`

// ErrNoBank is returned by the activities before UseBank was called.
var ErrNoBank = errors.New("transfer: no bank: call transfer.UseBank in the worker's main")

var current atomic.Pointer[Bank]

// UseBank sets the bank the activities call. The worker's main calls it once.
func UseBank(b *Bank) { current.Store(b) }

func theBank() (*Bank, error) {
	if b := current.Load(); b != nil {
		return b, nil
	}
	return nil, ErrNoBank
}

func cents(amount float32) int64 { return int64(math.Round(float64(amount) * 100)) }

// Open opens an account with balance, or leaves an existing one as it is.
func (b *Bank) Open(ctx context.Context, account string, balance float32) error {
	_, err := b.Pool.Exec(ctx, `INSERT INTO bank_accounts (id, balance_cents) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`,
		account, cents(balance))
	return err
}

// Move makes the movement, once per idempotency key, and returns its ID.
func (b *Bank) Move(ctx context.Context, m Movement) (int64, error) {
	if b.FaultFunc != nil {
		return b.FaultFunc(ctx, m, func(ctx context.Context) (int64, error) { return b.move(ctx, m) })
	}
	return b.move(ctx, m)
}

func (b *Bank) move(ctx context.Context, m Movement) (int64, error) {
	var key *string
	if m.IdempotencyKey != "" {
		key = &m.IdempotencyKey
	}
	var id int64
	err := b.Pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO bank_movements (idempotency_key, account, amount_cents, reference, kind) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, account, amount_cents),
		upd AS (UPDATE bank_accounts SET balance_cents = balance_cents + ins.amount_cents FROM ins WHERE bank_accounts.id = ins.account)
		SELECT id FROM ins UNION ALL SELECT id FROM bank_movements WHERE idempotency_key = $1 LIMIT 1`,
		key, m.Account, cents(m.Amount), m.Reference, m.Kind).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("bank: %s of %.2f on %s: %w", m.Kind, m.Amount, m.Account, err)
	}
	return id, nil
}

// Balance returns the balance of account.
func (b *Bank) Balance(ctx context.Context, account string) (float32, error) {
	var c int64
	err := b.Pool.QueryRow(ctx, `SELECT balance_cents FROM bank_accounts WHERE id = $1`, account).Scan(&c)
	return float32(c) / 100, err
}

// Movements counts a transfer's movements of each kind.
func (b *Bank) Movements(ctx context.Context, reference string) (map[string]int, error) {
	rows, err := b.Pool.Query(ctx, `SELECT kind, count(*) FROM bank_movements WHERE reference = $1 GROUP BY kind`, reference)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		out[kind] = n
	}
	return out, rows.Err()
}

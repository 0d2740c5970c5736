package idempotency_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// A request whose commit became durable and whose answer was lost: the client gets a
// 503 that says the outcome is unknown (not "not processed"), and its retry with the
// same key gets the committed response, with one order.
func TestMiddleware_CommittedThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	var held *pgtest.Held
	b := setupOn(t, &ledger.Config{}, nil, func(schema string) *pgxpool.Pool {
		held = pgtest.NewHeld(t, schema)
		return held.Pool
	})
	ctx := context.Background()
	done := held.TerminateAsync(ctx, t, 10*time.Second)
	first := b.post(t, "acme", "k-lost", `{"item":"lamp"}`)
	<-done
	require.Equal(t, http.StatusServiceUnavailable, first.status, string(first.body))
	var p struct{ Type string }
	require.NoError(t, json.Unmarshal(first.body, &p))
	require.Equal(t, idempotency.ProblemOutcomeUnknown, p.Type)
	require.NotEmpty(t, first.header.Get("Retry-After"))
	require.Equal(t, 1, b.orders(t), "the commit was durable")

	retry := b.post(t, "acme", "k-lost", `{"item":"lamp"}`)
	require.Equal(t, http.StatusCreated, retry.status, string(retry.body))
	require.Equal(t, 1, b.orders(t))
	require.EqualValues(t, 1, b.handlerCalls())
}

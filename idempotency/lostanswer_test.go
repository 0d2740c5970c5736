package idempotency_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// A failure stored before failures had a response of their own kept the response in
// base64 in its message: it still replays, byte for byte.
func TestMiddleware_LegacyStoredFailureReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.post(t, "acme", "k-legacy", `{"item":""}`)
	require.Equal(t, http.StatusUnprocessableEntity, first.status, string(first.body))
	// The record as an earlier version wrote a stored failure: no status or body, the
	// stored response in base64 in the message.
	tag, err := b.pool.Exec(context.Background(), `UPDATE `+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+
		` SET state = 'failed', error_code = 'http_422', error_message = encode(body, 'base64'), status_code = 0, body = NULL
		WHERE key = 'k-legacy'`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	r := b.post(t, "acme", "k-legacy", `{"item":""}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, string(r.body))
	require.Equal(t, first.body, r.body)
	require.Equal(t, first.header.Get("Content-Type"), r.header.Get("Content-Type"))
	require.Equal(t, "true", r.header.Get("Idempotency-Replayed"))
	require.EqualValues(t, 1, b.handlerCalls())
}

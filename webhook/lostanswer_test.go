package webhook_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/webhook"
)

// A delivery whose commit became durable and whose answer was lost: the sender gets a
// 503 to redeliver (not a 500 that says "not processed"), and the redelivery is a
// duplicate that does not run the handler again.
func TestReceiver_CommittedThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	var held *pgtest.Held
	b := setupOn(t, func(schema string) *pgxpool.Pool {
		held = pgtest.NewHeld(t, schema)
		return held.Pool
	})
	body := []byte(`{"issue":"7","version":1,"title":"lost"}`)
	done := held.TerminateAsync(context.Background(), t, 10*time.Second)
	status, state := b.deliver(t, "d-lost", body, sign(body))
	<-done
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, "error", state)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM receipts WHERE delivery = 'd-lost'`), "the commit was durable")

	status, state = b.deliver(t, "d-lost", body, sign(body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusDuplicate, state)
	require.EqualValues(t, 1, b.calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM receipts WHERE delivery = 'd-lost'`))
}

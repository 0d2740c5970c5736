package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// A handled message whose COMMIT became durable and whose answer was a FATAL error:
// Handle says the outcome is unknown (do not ack), never a plain failure, in both modes;
// the redelivery is a duplicate.
func TestInbox_CommittedThenFatalIsUnknown(t *testing.T) {
	t.Parallel()
	for name, mode := range map[string]inbox.Mode{"RecordFirst": inbox.ModeRecordFirst, "RecordWithFirstStatement": inbox.ModeRecordWithFirstStatement} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ib, pool := setup(t)
			schema := schemaOf(t, pool)
			h := pgtest.NewHeld(t, schema)
			held, err := inbox.New(h.Pool, &inbox.Config{Schema: schema, Mode: mode})
			require.NoError(t, err)
			ctx := context.Background()

			done := h.TerminateAsync(ctx, t, 10*time.Second)
			_, err = held.Handle(ctx, "billing", "msg-lost", credit("msg-lost"))
			<-done
			var unknown *ledger.OutcomeUnknownError
			require.ErrorAs(t, err, &unknown, "a lost answer to COMMIT must not read as a rollback")
			require.Equal(t, "msg-lost", string(unknown.Key))
			testsuite.RequireExactlyOnce(ctx, t, pool, `SELECT count(*) FROM credits WHERE message = 'msg-lost'`)

			res, err := ib.Handle(ctx, "billing", "msg-lost", credit("msg-lost"))
			require.NoError(t, err)
			require.True(t, res.Duplicate)
			testsuite.RequireExactlyOnce(ctx, t, pool, `SELECT count(*) FROM credits WHERE message = 'msg-lost'`)
		})
	}
}

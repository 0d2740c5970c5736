package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// Get finds a message's record by subscriber and message ID: processed, rejected with
// its reason, expired; a message never recorded (or whose handler failed) is
// ErrNotFound.
func TestGet_ProcessedRejectedAndMissing(t *testing.T) {
	t.Parallel()
	ib, pool := setup(t)
	ctx := context.Background()
	_, err := ib.Handle(ctx, "billing", "m-ok", credit("m-ok"))
	require.NoError(t, err)
	_, err = ib.Handle(ctx, "billing", "m-bad", func(context.Context, pgx.Tx) error {
		return ledger.Definitive("bad_payload", "amount is not a number")
	})
	require.Error(t, err)
	_, err = ib.Handle(ctx, "billing", "m-failed", func(context.Context, pgx.Tx) error { return errors.New("boom") })
	require.Error(t, err)

	r, err := ib.Get(ctx, "billing", "m-ok")
	require.NoError(t, err)
	require.Equal(t, "processed", r.State)
	require.Empty(t, r.Error)
	require.False(t, r.Expired)
	require.True(t, r.ExpiresAt.After(r.ReceivedAt))

	r, err = ib.Get(ctx, "billing", "m-bad")
	require.NoError(t, err)
	require.Equal(t, "rejected", r.State)
	require.Contains(t, r.Error, "amount is not a number")

	for _, id := range [][2]string{{"billing", "m-failed"}, {"billing", "m-never"}, {"analytics", "m-ok"}} {
		_, err = ib.Get(ctx, id[0], id[1])
		require.ErrorIs(t, err, inbox.ErrNotFound, id)
	}

	_, err = pool.Exec(ctx, `UPDATE `+pgx.Identifier{schemaOf(t, pool), "inbox_messages"}.Sanitize()+` SET expires_at = now() - interval '1 hour'`)
	require.NoError(t, err)
	r, err = ib.Get(ctx, "billing", "m-ok")
	require.NoError(t, err)
	require.True(t, r.Expired)
}

// oncekit.inbox.messages counts a message the handler rejected for good as rejected,
// not as an error: the handler did what it was meant to, and nothing is redelivered.
func TestTelemetry_RejectedIsNotAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ib, err := inbox.New(pool, &inbox.Config{Schema: schema, MeterProvider: mp})
	require.NoError(t, err)

	poison := func(context.Context, pgx.Tx) error { return ledger.Definitive("bad_payload", "no") }
	_, err = ib.Handle(ctx, "billing", "m-1", poison)
	require.Error(t, err)
	_, err = ib.Handle(ctx, "billing", "m-1", poison)
	require.NoError(t, err)
	_, err = ib.Handle(ctx, "billing", "m-2", func(context.Context, pgx.Tx) error { return errors.New("boom") })
	require.Error(t, err)
	_, err = ib.Handle(ctx, "billing", "m-3", func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "oncekit.inbox.messages" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				o, _ := dp.Attributes.Value(inbox.AttrOutcome)
				got[o.AsString()] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"rejected": 1, "duplicate": 1, "error": 1, "handled": 1}, got)
}

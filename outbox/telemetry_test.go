package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/outbox"
)

// A published event and a dead one show in the outbox's metrics, spans and log.
func TestTelemetry_PublishedAndDeadEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	var logs bytes.Buffer
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema,
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)),
		Logger:         slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	b.out = out
	good := b.produce(t, "acc-good", 1)
	bad := b.produce(t, "acc-bad", 2)
	d := b.dispatcher(t, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if e.ID == bad {
			return errors.Join(outbox.ErrPermanent, errors.New("the consumer refuses this payload"))
		}
		return nil
	}), nil)
	b.drain(t, d)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	sums := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					sums[m.Name] += dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					state, _ := dp.Attributes.Value("oncekit.state")
					sums[m.Name+"/"+state.AsString()] = dp.Value
				}
			}
		}
	}
	require.Equal(t, int64(1), sums["oncekit.outbox.published"])
	require.Equal(t, int64(1), sums["oncekit.outbox.publish.failed"])
	require.Equal(t, int64(1), sums["oncekit.outbox.dead"])
	require.Equal(t, int64(1), sums["oncekit.outbox.backlog/dead"])
	require.Equal(t, int64(0), sums["oncekit.outbox.backlog/pending"])

	got := map[string]string{}
	for _, s := range spans.GetSpans() {
		require.Equal(t, "oncekit.outbox.publish", s.Name)
		for _, a := range s.Attributes {
			if a.Key == attribute.Key(outbox.AttrEventID) {
				got[a.Value.AsString()] = s.Status.Code.String()
			}
		}
	}
	require.Equal(t, map[string]string{good.String(): "Unset", bad.String(): "Error"}, got)
	require.Contains(t, logs.String(), "an outbox event is dead")
	require.Contains(t, logs.String(), bad.String())
}

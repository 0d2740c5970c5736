package countmeter_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncekit/oncekit/internal/countmeter"
)

func TestProvider_SumsCountersByAttributes(t *testing.T) {
	t.Parallel()
	p := countmeter.New()
	c, err := p.Meter("m").Int64Counter("calls")
	require.NoError(t, err)
	h, err := p.Meter("m").Float64Histogram("ignored")
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			c.Add(context.Background(), 2, metric.WithAttributes(attribute.String("outcome", "first")))
			c.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", "replay")))
			h.Record(context.Background(), 1)
		})
	}
	wg.Wait()
	require.Equal(t, map[string]int64{"calls{outcome=first}": 100, "calls{outcome=replay}": 50}, p.Sums())
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/countmeter"
)

// envOTLP names the OTLP endpoint a worker exports its metrics and traces to, when the
// demo is given one.
const envOTLP = "PAYMENT_DEMO_OTLP"

// serviceName names the demo's workers in what they export.
const serviceName = "oncekit-payment-demo"

// otlpInterval is how often a worker exports its metrics: a SIGKILLed worker loses at
// most this much of them.
const otlpInterval = 5 * time.Second

// telemetry is what a worker records its ledger's metrics and spans with.
type telemetry struct {
	meter  metric.MeterProvider
	tracer trace.TracerProvider // nil: no spans
	// sums returns the counters' sums, keyed as countmeter keys them, for the summary
	// the demo prints at the end.
	sums func() map[string]int64
	// shutdown exports what is left.
	shutdown func(context.Context) error
}

// checkOTLP refuses an OTLP endpoint that is not an http or https URL with a host.
func checkOTLP(endpoint string) error {
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("-otlp (or OTEL_EXPORTER_OTLP_ENDPOINT): give the OTLP/gRPC endpoint as a URL, such as http://localhost:4317")
	}
	return nil
}

// newTelemetry returns a worker's telemetry: counters summed in memory for the demo's
// summary, and, when endpoint is set, every metric and span exported to that OTLP/gRPC
// endpoint, such as http://localhost:4317 (an OpenTelemetry Collector, Jaeger,
// Grafana Alloy, ...).
func newTelemetry(ctx context.Context, endpoint string) (*telemetry, error) {
	if endpoint == "" {
		m := countmeter.New()
		return &telemetry{meter: m, sums: m.Sums, shutdown: func(context.Context) error { return nil }}, nil
	}
	res := resource.NewSchemaless(attribute.String("service.name", serviceName),
		attribute.String("service.instance.id", fmt.Sprintf("worker-%d", os.Getpid())))
	metrics, err := otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("OTLP metrics exporter for %s: %w", endpoint, err)
	}
	spans, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter for %s: %w", endpoint, err)
	}
	// A second reader, read in process, gives the summary the same counts.
	local := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(local),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metrics, sdkmetric.WithInterval(otlpInterval))))
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(spans))
	return &telemetry{meter: mp, tracer: tp,
		sums: func() map[string]int64 { return counterSums(local) },
		shutdown: func(ctx context.Context) error {
			return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
		}}, nil
}

// counterSums collects r and keys its int64 counters' sums as countmeter does:
// name{key=value,...}.
func counterSums(r *sdkmetric.ManualReader) map[string]int64 {
	sums := map[string]int64{}
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		return sums
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				continue
			}
			for _, dp := range sum.DataPoints {
				sums[m.Name+"{"+dp.Attributes.Encoded(attribute.DefaultEncoder())+"}"] += dp.Value
			}
		}
	}
	return sums
}

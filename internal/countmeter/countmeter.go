// Package countmeter is an in-memory OpenTelemetry MeterProvider built on the metric API
// alone: it sums what is added to Int64Counters, by instrument and attributes, and
// ignores every other instrument. The demo reads its summary from it and the benchmark
// measures a metered ledger with it.
package countmeter

import (
	"context"
	"maps"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"
)

// Provider sums counters. The zero value is not usable; call New.
type Provider struct {
	embedded.MeterProvider
	mu   sync.Mutex
	sums map[string]int64
}

// New returns an empty provider.
func New() *Provider { return &Provider{sums: map[string]int64{}} }

// Meter returns a meter whose counters add to p.
func (p *Provider) Meter(string, ...metric.MeterOption) metric.Meter { return &meter{p: p} }

// Sums returns the sums so far, keyed by instrument name and its attributes in the
// form name{key=value,...}.
func (p *Provider) Sums() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.sums)
}

type meter struct {
	noop.Meter
	p *Provider
}

func (m *meter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return &counter{p: m.p, name: name}, nil
}

type counter struct {
	noop.Int64Counter
	p    *Provider
	name string
}

func (c *counter) Add(_ context.Context, incr int64, opts ...metric.AddOption) {
	set := metric.NewAddConfig(opts).Attributes()
	key := c.name + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
	c.p.mu.Lock()
	c.p.sums[key] += incr
	c.p.mu.Unlock()
}

// Package otelx is what oncekit's packages share to set up their telemetry from a
// Config: a meter when a MeterProvider is given, a tracer when a TracerProvider is, and a
// logger that discards when none is.
package otelx

import (
	"log/slog"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Setup is a package's telemetry: Meter is nil without a MeterProvider, Tracer without a
// TracerProvider.
type Setup struct {
	Meter  metric.Meter
	Tracer trace.Tracer
	Log    *slog.Logger
}

// New returns the telemetry of the instrumentation named name.
func New(name string, mp metric.MeterProvider, tp trace.TracerProvider, log *slog.Logger) Setup {
	s := Setup{Log: log}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if mp != nil {
		s.Meter = mp.Meter(name)
	}
	if tp != nil {
		s.Tracer = tp.Tracer(name)
	}
	return s
}

// Instruments creates a package's instruments on one meter and keeps the first error,
// so that a package lists its instruments without an error check each.
type Instruments struct {
	Meter metric.Meter
	Err   error
}

// Counter creates an Int64Counter.
func (in *Instruments) Counter(name, unit, desc string) metric.Int64Counter {
	c, err := in.Meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.keep(err)
	return c
}

// Histogram creates a Float64Histogram in seconds.
func (in *Instruments) Histogram(name, desc string) metric.Float64Histogram {
	h, err := in.Meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
	in.keep(err)
	return h
}

func (in *Instruments) keep(err error) {
	if in.Err == nil {
		in.Err = err
	}
}

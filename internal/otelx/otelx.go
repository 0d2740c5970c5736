// Package otelx is what oncekit's packages share to set up their telemetry from a
// Config: a meter when a MeterProvider is given, a tracer when a TracerProvider is, and a
// logger that discards when none is. Meters and tracers carry the instrumentation
// version, and histograms the bucket boundaries their durations need.
package otelx

import (
	"log/slog"
	"runtime/debug"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Module is the module whose version names the instrumentation's.
const Module = "github.com/oncekit/oncekit"

// Setup is a package's telemetry: Meter is nil without a MeterProvider, Tracer without a
// TracerProvider.
type Setup struct {
	Meter  metric.Meter
	Tracer trace.Tracer
	Log    *slog.Logger
}

// New returns the telemetry of the instrumentation named name, at [Version].
func New(name string, mp metric.MeterProvider, tp trace.TracerProvider, log *slog.Logger) Setup {
	s := Setup{Log: log}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if mp != nil {
		s.Meter = mp.Meter(name, metric.WithInstrumentationVersion(Version()))
	}
	if tp != nil {
		s.Tracer = tp.Tracer(name, trace.WithInstrumentationVersion(Version()))
	}
	return s
}

var version = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if info.Main.Path == Module {
		return cleanVersion(info.Main.Version)
	}
	for _, d := range info.Deps {
		if d.Path == Module {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return cleanVersion(d.Version)
		}
	}
	return "unknown"
})

func cleanVersion(v string) string {
	if v == "" || v == "(devel)" {
		return "devel"
	}
	return v
}

// Version is the version of the oncekit module this program was built with, as the Go
// build recorded it: a tag such as v0.4.0, a pseudo-version, or "devel" for a build
// from a work tree (a replaced module, tests).
func Version() string { return version() }

// DurationBuckets are the bucket boundaries, in seconds, of every duration histogram:
// OpenTelemetry's HTTP convention (0.005 to 10 s) below which 1 and 2.5 ms are added,
// since a ledger call on a nearby PostgreSQL takes about a millisecond. The SDK's default
// boundaries are for milliseconds, and would put every call in the first bucket.
var DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

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

// Histogram creates a Float64Histogram in seconds, advising [DurationBuckets].
func (in *Instruments) Histogram(name, desc string) metric.Float64Histogram {
	h, err := in.Meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	in.keep(err)
	return h
}

func (in *Instruments) keep(err error) {
	if in.Err == nil {
		in.Err = err
	}
}

package main

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// receiver is an OTLP/gRPC endpoint that keeps what it is sent: the names of the
// metrics and spans, and the service each came from.
type receiver struct {
	mu       sync.Mutex
	metrics  map[string]bool
	spans    map[string]bool
	services map[string]bool
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	r *receiver
}

func (s metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, kv := range rm.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				s.r.services[kv.GetValue().GetStringValue()] = true
			}
		}
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				s.r.metrics[m.GetName()] = true
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.r.spans[sp.GetName()] = true
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startReceiver serves a receiver on a free local port and returns it with its URL.
func startReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &receiver{metrics: map[string]bool{}, spans: map[string]bool{}, services: map[string]bool{}}
	srv := grpc.NewServer()
	colmetricpb.RegisterMetricsServiceServer(srv, metricsService{r: r})
	coltracepb.RegisterTraceServiceServer(srv, traceService{r: r})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, "http://" + lis.Addr().String()
}

// Given an endpoint, a worker exports its metrics and spans over OTLP, named as the
// demo's service, and its summary still counts; without one it exports nothing.
func TestTelemetry_ExportsToOTLP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, url := startReceiver(t)
	tel, err := newTelemetry(ctx, url)
	require.NoError(t, err)
	calls, err := tel.meter.Meter("github.com/oncekit/oncekit/ledger").Int64Counter("oncekit.ledger.calls")
	require.NoError(t, err)
	calls.Add(ctx, 2)
	_, span := tel.tracer.Tracer("github.com/oncekit/oncekit/ledger").Start(ctx, "oncekit.ledger.Claim")
	span.End()
	require.Equal(t, map[string]int64{"oncekit.ledger.calls{}": 2}, tel.sums())
	require.NoError(t, tel.shutdown(ctx), "shutting down exports what is left")

	r.mu.Lock()
	defer r.mu.Unlock()
	require.True(t, r.metrics["oncekit.ledger.calls"], "metrics received: %v", r.metrics)
	require.True(t, r.spans["oncekit.ledger.Claim"], "spans received: %v", r.spans)
	require.Equal(t, map[string]bool{serviceName: true}, r.services)

	local, err := newTelemetry(ctx, "")
	require.NoError(t, err)
	require.Nil(t, local.tracer)
}

// An endpoint that is not a URL is refused before anything starts.
func TestTelemetry_RefusesABadEndpoint(t *testing.T) {
	t.Parallel()
	require.NoError(t, checkOTLP(""))
	require.NoError(t, checkOTLP("http://localhost:4317"))
	for _, bad := range []string{"localhost:4317", "grpc://collector:4317", "http://", "::"} {
		require.Error(t, checkOTLP(bad), bad)
	}
}

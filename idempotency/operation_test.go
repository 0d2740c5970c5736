package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// When the middleware wraps a whole ServeMux, the operation (and with it the records'
// scope, the metric attribute and the span attribute) is the route pattern the mux
// matches, never the concrete path: a hundred orders are one series, not a hundred.
func TestMiddleware_OperationIsTheRoutePattern(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	l, err := ledger.New(pool, &ledger.Config{Schema: schema,
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))})
	require.NoError(t, err)
	mw, err := idempotency.New(&idempotency.Config{Ledger: l, TenantFunc: idempotency.FixedTenant("acme")})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/refund", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "refunded %s", r.PathValue("id"))
	})
	srv := httptest.NewServer(mw(mux))
	defer srv.Close()

	post := func(target, key string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+target, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body := readAll(t, resp)
		if resp.StatusCode == http.StatusCreated {
			require.Equal(t, "refunded "+strings.Split(target, "/")[2], string(body), "the mux still routes")
		}
		return resp.StatusCode
	}
	for id := 1000; id < 1005; id++ {
		require.Equal(t, http.StatusCreated, post(fmt.Sprintf("/orders/%d/refund", id), fmt.Sprintf("k-%d", id)))
	}
	// A path the mux does not route runs nothing and is not guarded: no record, no series.
	require.Equal(t, http.StatusNotFound, post("/elsewhere/1", "k-x"))

	want := "POST /orders/{id}/refund"
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	ops := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "oncekit.ledger.calls" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				op, _ := dp.Attributes.Value(attribute.Key(ledger.AttrOperation))
				ops[op.AsString()] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{want: 5}, ops, "metric attribute %s", ledger.AttrOperation)
	require.Len(t, spans.GetSpans(), 5)
	for _, s := range spans.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == ledger.AttrOperation {
				require.Equal(t, want, a.Value.AsString(), "span attribute")
			}
		}
	}
	var distinct []string
	rows, err := pool.Query(ctx, `SELECT DISTINCT operation FROM `+pgx.Identifier{schema, "idempotency_records"}.Sanitize())
	require.NoError(t, err)
	for rows.Next() {
		var op string
		require.NoError(t, rows.Scan(&op))
		distinct = append(distinct, op)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{want}, distinct)
}

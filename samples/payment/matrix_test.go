package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// Every activity of the payment saga, compensations included, crashed at every crash
// point that applies to it, one order each, on a real Temporal dev server: before the
// effect, with the effect done and not committed (the ledger's transaction, or the
// provider's call unrecorded), after the commit with the completion lost, and with the
// provider's answer lost. Each order's effects exist exactly once.
func TestCrashPointMatrix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close() })
	srv := testsuite.StartDevServer(t)
	pool, err := setupDatabase(ctx, env.DatabaseURL, []string{defaultShop})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	providerURL, stopProvider, err := startProvider(pool, false)
	require.NoError(t, err)
	t.Cleanup(stopProvider)
	l, err := ledger.New(pool, &ledger.Config{Schema: demoSchema})
	require.NoError(t, err)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "shop"})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	d := &deps{pool: pool, provider: providerURL, http: &http.Client{Timeout: 2 * time.Second}}

	local := []testsuite.CrashPoint{testsuite.BeforeEffect, testsuite.BeforeCommit, testsuite.AfterEffect}
	external := []testsuite.CrashPoint{testsuite.BeforeEffect, testsuite.AfterCall, testsuite.AfterEffect, testsuite.LostAnswer}
	matrix := []struct {
		activity   string
		compensate bool // the order is refused at shipping, so compensations run
		points     []testsuite.CrashPoint
	}{
		{actReserve, false, local},
		{actCharge, false, external},
		{actShip, false, local},
		{actRelease, true, local},
		{actRefund, true, external},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%-20s", "activity \\ point")
	all := []testsuite.CrashPoint{testsuite.BeforeEffect, testsuite.BeforeCommit, testsuite.AfterCall, testsuite.AfterEffect, testsuite.LostAnswer}
	for _, p := range all {
		fmt.Fprintf(&table, "%-15s", p)
	}
	table.WriteString("\n")
	n := 0
	for _, row := range matrix {
		fmt.Fprintf(&table, "%-20s", row.activity)
		for _, point := range all {
			if !contains(row.points, point) {
				fmt.Fprintf(&table, "%-15s", "-")
				continue
			}
			n++
			o := Order{ID: fmt.Sprintf("matrix-%d", n), SKU: "sku-0", Qty: 1, Amount: 100 + int64(n), ShippingFails: row.compensate}
			plan := testsuite.NewFaultPlan().CrashAt(row.activity, point, 1)
			queue := "matrix-" + o.ID
			w := tworker.New(c, queue, tworker.Options{Interceptors: []interceptor.WorkerInterceptor{plan.Interceptor()}})
			registerCheckout(w, d)
			require.NoError(t, w.Start())
			wctx, cancel := context.WithTimeout(keys.WithTenant(ctx, "shop"), time.Minute)
			run, err := c.ExecuteWorkflow(wctx, client.StartWorkflowOptions{TaskQueue: queue, WorkflowExecutionTimeout: time.Minute}, wfCheckout, o)
			require.NoError(t, err)
			werr := run.Get(wctx, nil)
			cancel()
			w.Stop()
			require.Len(t, plan.Injected(), 1, "%s at %s: the crash was injected", row.activity, point)
			if row.compensate {
				require.True(t, isCompensated(werr), "%s at %s: %v", row.activity, point, werr)
			} else {
				require.NoError(t, werr, "%s at %s", row.activity, point)
			}
			effects := orderEffects(t, ctx, d, o.ID)
			want := orderEffectsWant{reservations: 1, charges: 1, shipments: 1}
			if row.compensate {
				want = orderEffectsWant{reservations: 1, released: 1, charges: 1, refunds: 1}
			}
			require.Equal(t, want, effects, "%s at %s: every effect once", row.activity, point)
			fmt.Fprintf(&table, "%-15s", "once")
		}
		table.WriteString("\n")
	}
	t.Logf("crash-point matrix, one order per cell, on a real dev server:\n%s", table.String())
}

type orderEffectsWant struct{ reservations, released, charges, refunds, shipments int }

func orderEffects(t *testing.T, ctx context.Context, d *deps, orderID string) orderEffectsWant {
	t.Helper()
	var e orderEffectsWant
	require.NoError(t, d.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM reservations WHERE mode = 'oncekit' AND order_id = $1),
		(SELECT count(*) FROM reservations WHERE mode = 'oncekit' AND order_id = $1 AND released),
		(SELECT count(*) FROM provider_charges WHERE merchant = 'oncekit' AND order_id = $1),
		(SELECT count(*) FROM provider_refunds WHERE merchant = 'oncekit' AND order_id = $1),
		(SELECT count(*) FROM shipments WHERE mode = 'oncekit' AND order_id = $1)`, orderID).
		Scan(&e.reservations, &e.released, &e.charges, &e.refunds, &e.shipments))
	return e
}

func contains(points []testsuite.CrashPoint, p testsuite.CrashPoint) bool {
	for _, q := range points {
		if q == p {
			return true
		}
	}
	return false
}

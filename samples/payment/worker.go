package main

import (
	"context"
	"net/http"
	"os"
	"time"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/worker"
)

// Environment of a worker process, set by the demo when it starts one.
const (
	envRole      = "PAYMENT_DEMO_ROLE" // "worker"
	envDB        = "PAYMENT_DEMO_DB"
	envTemporal  = "PAYMENT_DEMO_TEMPORAL"
	envNamespace = "PAYMENT_DEMO_NAMESPACE"
	envProvider  = "PAYMENT_DEMO_PROVIDER"
	envQueue     = "PAYMENT_DEMO_QUEUE"
)

// runWorker is a worker process: both sagas' workflows and activities, until killed.
func runWorker(ctx context.Context) error {
	shards := os.Getenv(envShards)
	if shards == "" {
		shards = shardName(0) + "=" + os.Getenv(envDB)
	}
	router, closePools, err := openShards(ctx, shards)
	if err != nil {
		return err
	}
	defer closePools()
	pool := router.Shards()[0].Pool
	tel, err := newTelemetry(ctx, os.Getenv(envOTLP))
	if err != nil {
		return err
	}
	defer func() {
		// Export what is left after a SIGTERM; a SIGKILLed worker loses its last interval.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tel.shutdown(sctx)
	}()
	go keepMetrics(ctx, tel.sums, os.Getenv(envMetrics))
	lcfg := &ledger.Config{Schema: demoSchema, MeterProvider: tel.meter, TracerProvider: tel.tracer}
	l, err := ledger.New(pool, lcfg)
	if len(router.Shards()) > 1 {
		l, err = ledger.NewSharded(router, lcfg)
	}
	if err != nil {
		return err
	}
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l, DefaultTenant: "shop"})
	if err != nil {
		return err
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv(envTemporal), Namespace: os.Getenv(envNamespace), Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	if err != nil {
		return err
	}
	defer c.Close()
	d := &deps{pool: pool, provider: os.Getenv(envProvider), http: &http.Client{Timeout: 2 * time.Second}}

	queue := os.Getenv(envQueue)
	w := tworker.New(c, queue, tworker.Options{})
	registerCheckout(w, d)
	w.RegisterWorkflowWithOptions(NaiveCheckoutWorkflow, workflow.RegisterOptions{Name: wfNaiveCheckout})
	w.RegisterActivityWithOptions(d.naiveReserve, tactivity.RegisterOptions{Name: "naive." + actReserve})
	w.RegisterActivityWithOptions(d.naiveRelease, tactivity.RegisterOptions{Name: "naive." + actRelease})
	w.RegisterActivityWithOptions(d.naiveCharge, tactivity.RegisterOptions{Name: "naive." + actCharge})
	w.RegisterActivityWithOptions(d.naiveRefund, tactivity.RegisterOptions{Name: "naive." + actRefund})
	w.RegisterActivityWithOptions(d.naiveShip, tactivity.RegisterOptions{Name: "naive." + actShip})
	if err := w.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	w.Stop()
	return nil
}

// registerCheckout registers oncekit's saga: its workflow and activities.
func registerCheckout(w tworker.Worker, d *deps) {
	w.RegisterWorkflowWithOptions(CheckoutWorkflow, workflow.RegisterOptions{Name: wfCheckout})
	w.RegisterActivityWithOptions(d.reserve, tactivity.RegisterOptions{Name: actReserve})
	w.RegisterActivityWithOptions(d.release, tactivity.RegisterOptions{Name: actRelease})
	w.RegisterActivityWithOptions(d.charge, tactivity.RegisterOptions{Name: actCharge})
	w.RegisterActivityWithOptions(d.refund, tactivity.RegisterOptions{Name: actRefund})
	w.RegisterActivityWithOptions(d.ship, tactivity.RegisterOptions{Name: actShip})
}

package main

import (
	"context"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
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
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = demoSchema
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: demoSchema})
	if err != nil {
		return err
	}
	c, err := worker.Dial(ctx, client.Options{HostPort: os.Getenv(envTemporal), Namespace: os.Getenv(envNamespace), Logger: testsuite.QuietLogger{}})
	if err != nil {
		return err
	}
	defer c.Close()
	d := &deps{pool: pool, provider: os.Getenv(envProvider), http: &http.Client{Timeout: 2 * time.Second}}

	queue := os.Getenv(envQueue)
	w, err := worker.New(c, queue, l, &worker.Options{DefaultTenant: "shop"})
	if err != nil {
		return err
	}
	w.RegisterWorkflow(wfCheckout, CheckoutWorkflow)
	w.RegisterActivity(actReserve, d.reserve)
	w.RegisterActivity(actRelease, d.release)
	w.RegisterActivity(actCharge, d.charge)
	w.RegisterActivity(actRefund, d.refund)
	w.RegisterActivity(actShip, d.ship)
	w.RegisterWorkflow(wfNaiveCheckout, NaiveCheckoutWorkflow)
	w.RegisterActivity("naive."+actReserve, d.naiveReserve)
	w.RegisterActivity("naive."+actRelease, d.naiveRelease)
	w.RegisterActivity("naive."+actCharge, d.naiveCharge)
	w.RegisterActivity("naive."+actRefund, d.naiveRefund)
	w.RegisterActivity("naive."+actShip, d.naiveShip)
	if err := w.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	w.Stop()
	return nil
}

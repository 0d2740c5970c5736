package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/worker"
)

// demoSchema holds the demo's tables and ledgers; each run recreates it.
const (
	demoSchema     = "oncekit_demo"
	providerSchema = "oncekit_demo_provider"
)

type config struct {
	orders      int
	concurrency int
	uiPort      int
	naive       bool
}

func main() {
	if os.Getenv(envRole) == "worker" {
		workerMain()
		return
	}
	var cfg config
	flag.IntVar(&cfg.orders, "orders", 300, "orders to check out, through each saga")
	flag.IntVar(&cfg.concurrency, "concurrency", 60, "checkouts in flight at once")
	flag.IntVar(&cfg.uiPort, "ui-port", 0, "serve the Temporal Web UI on this port (dev server only) and keep it up after the run, to browse the sagas")
	flag.BoolVar(&cfg.naive, "naive", true, "run the same orders through the naive saga too")
	flag.Parse()
	rep, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payment demo:", err)
		os.Exit(2)
	}
	if !rep.ok() {
		os.Exit(1)
	}
}

// workerMain runs this process as a worker until it is signalled or killed.
func workerMain() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := runWorker(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(cfg config) (demoReport, error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()

	tmp, err := devenv.Start(ctx, &devenv.Config{UIPort: cfg.uiPort, Progress: os.Stderr})
	if err != nil {
		return demoReport{}, err
	}
	defer func() { _ = tmp.Close() }()
	fmt.Printf("PostgreSQL ready; Temporal at %s", tmp.TemporalAddress)
	if tmp.UIAddress != "" {
		fmt.Printf(", web UI at %s", tmp.UIAddress)
	}
	fmt.Println()

	pool, err := setupDatabase(ctx, tmp.DatabaseURL)
	if err != nil {
		return demoReport{}, err
	}
	defer pool.Close()
	providerURL, stopProvider, err := startProvider(pool)
	if err != nil {
		return demoReport{}, err
	}
	defer stopProvider()

	queue := "checkout-" + uuid.NewString()[:8]
	metricsDir, err := os.MkdirTemp("", "oncekit-demo-metrics-")
	if err != nil {
		return demoReport{}, err
	}
	defer func() { _ = os.RemoveAll(metricsDir) }()
	sup := &supervisor{env: []string{envRole + "=worker", envDB + "=" + tmp.DatabaseURL, envTemporal + "=" + tmp.TemporalAddress,
		envNamespace + "=" + tmp.Namespace, envProvider + "=" + providerURL, envQueue + "=" + queue, envMetrics + "=" + metricsDir}}
	sup.start()
	defer sup.stop()

	c, err := client.Dial(client.Options{HostPort: tmp.TemporalAddress, Namespace: tmp.Namespace, Logger: devenv.QuietLogger(),
		ContextPropagators: []workflow.ContextPropagator{worker.TenantPropagator()}})
	if err != nil {
		return demoReport{}, err
	}
	defer c.Close()

	orders := makeOrders(cfg.orders, queue)
	modes := []string{"oncekit"}
	if cfg.naive {
		modes = append(modes, "naive")
	}
	fmt.Printf("Checking out %d orders through %d sagas. Faults per saga: worker SIGKILLed after %d charges, %d charge answers lost, %d shipments refused (%d refund answers lost), %d orders submitted twice\n",
		len(orders), len(modes), countIf(orders, func(o Order) bool { return o.KillAfterCharge }),
		countIf(orders, func(o Order) bool { return o.LoseChargeResponse }),
		countIf(orders, func(o Order) bool { return o.ShippingFails }),
		countIf(orders, func(o Order) bool { return o.LoseRefundResponse }), countTwice(len(orders)))
	outcomes, err := checkout(ctx, c, queue, orders, modes, cfg.concurrency, sup)
	if err != nil {
		return demoReport{}, err
	}
	rep, err := report(ctx, pool, orders, modes, outcomes)
	if err != nil {
		return demoReport{}, err
	}
	fmt.Println()
	rep.print(os.Stdout, sup.restarts.Load(), time.Since(start))
	sup.stop() // the workers write their last counts as they stop
	if err := printMetrics(os.Stdout, metricsDir); err != nil {
		return demoReport{}, err
	}
	if tmp.UIAddress != "" {
		sup.stop()
		fmt.Printf("\nBrowse the sagas at %s (namespace %s). Press Ctrl-C to stop.\n", tmp.UIAddress, tmp.Namespace)
		<-ctx.Done()
	}
	return rep, nil
}

func countIf(orders []Order, f func(Order) bool) int {
	n := 0
	for _, o := range orders {
		if f(o) {
			n++
		}
	}
	return n
}

// makeOrders gives orders faults, the same for both sagas: one in twenty kills the
// worker right after its charge; one in ten loses the provider's answer to the charge;
// one in ten is refused by shipping (and compensated), half of those losing the answer
// to the refund; one in ten is submitted twice.
func makeOrders(n int, run string) []Order {
	orders := make([]Order, n)
	for i := range orders {
		orders[i] = Order{
			ID: fmt.Sprintf("%s-order-%03d", run, i+1), SKU: fmt.Sprintf("sku-%d", i%5), Qty: 1 + i%3, Amount: int64(1000 + 10*i),
			KillAfterCharge:    i%20 == 1,
			LoseChargeResponse: i%10 == 2,
			ShippingFails:      i%10 == 3,
			LoseRefundResponse: i%20 == 3,
		}
	}
	return orders
}

func twice(i int) bool { return i%10 == 4 }

func countTwice(n int) int {
	c := 0
	for i := range n {
		if twice(i) {
			c++
		}
	}
	return c
}

// outcome of one order in one saga.
type outcome struct {
	shipped     bool
	compensated bool
	err         error
}

// checkout submits every order to every saga, at most concurrency at once, with a
// second submission for the orders marked for it, and waits for all of them.
func checkout(ctx context.Context, c client.Client, queue string, orders []Order, modes []string, concurrency int, sup *supervisor) (map[string][]outcome, error) {
	out := map[string][]outcome{}
	for _, m := range modes {
		out[m] = make([]outcome, len(orders))
	}
	var done atomic.Int64
	total := int64(len(orders) * len(modes))
	ticker := time.NewTicker(3 * time.Second)
	defer ticker.Stop()
	go func() {
		for range ticker.C {
			fmt.Printf("  %d/%d checkouts finished, worker restarted %d times\n", done.Load(), total, sup.restarts.Load())
		}
	}()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i, o := range orders {
		for _, mode := range modes {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				out[mode][i] = runOrder(ctx, c, queue, mode, o, twice(i))
				done.Add(1)
			})
		}
	}
	wg.Wait()
	fmt.Printf("  %d/%d checkouts finished, worker restarted %d times\n", done.Load(), total, sup.restarts.Load())
	return out, ctx.Err()
}

func runOrder(ctx context.Context, c client.Client, queue, mode string, o Order, submitTwice bool) outcome {
	wf := wfCheckout
	if mode == "naive" {
		wf = wfNaiveCheckout
	}
	ctx = keys.WithTenant(ctx, "shop")
	submit := func(id string) (client.WorkflowRun, error) {
		return c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue, WorkflowExecutionTimeout: 5 * time.Minute}, wf, o)
	}
	runs := []string{mode + "-" + o.ID}
	if submitTwice {
		// A client retried after a timeout and submitted the order again, under a new
		// workflow ID: Temporal cannot tell the two apart; only the order ID can.
		runs = append(runs, mode+"-"+o.ID+"-again")
	}
	var wg sync.WaitGroup
	results := make([]outcome, len(runs))
	for i, id := range runs {
		wg.Go(func() {
			run, err := submit(id)
			if err != nil {
				results[i] = outcome{err: err}
				return
			}
			err = run.Get(ctx, nil)
			results[i] = outcome{shipped: err == nil, compensated: isCompensated(err), err: err}
		})
	}
	wg.Wait()
	return results[0]
}

// supervisor keeps one worker process running, restarting it when it dies.
type supervisor struct {
	env      []string
	restarts atomic.Int64
	mu       sync.Mutex
	cmd      *exec.Cmd
	stopped  bool
	done     chan struct{}
}

func (s *supervisor) start() {
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		for first := true; ; first = false {
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				return
			}
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), s.env...)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				s.mu.Unlock()
				fmt.Fprintln(os.Stderr, "supervisor:", err)
				return
			}
			s.cmd = cmd
			s.mu.Unlock()
			if !first {
				s.restarts.Add(1)
			}
			_ = cmd.Wait()
		}
	}()
}

func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopped = true
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.mu.Lock()
		_ = s.cmd.Process.Kill()
		s.mu.Unlock()
	}
}

func startProvider(pool *pgxpool.Pool) (string, func(), error) {
	l, err := ledger.New(pool, &ledger.Config{Schema: providerSchema})
	if err != nil {
		return "", nil, err
	}
	p := &provider{pool: pool, ledger: l, lost: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: p.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

func setupDatabase(ctx context.Context, url string) (*pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	for _, s := range []string{demoSchema, providerSchema} {
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			return nil, err
		}
		if _, err := migrate.Up(ctx, conn, s); err != nil {
			return nil, err
		}
	}
	_, err = conn.Exec(ctx, `SET search_path TO `+demoSchema+`;
		CREATE TABLE inventory (mode text NOT NULL, sku text NOT NULL, available int NOT NULL, PRIMARY KEY (mode, sku));
		INSERT INTO inventory SELECT m, 'sku-' || i, 10000 FROM unnest(ARRAY['oncekit', 'naive']) m, generate_series(0, 4) i;
		CREATE TABLE reservations (id bigserial PRIMARY KEY, mode text NOT NULL, order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL, released bool NOT NULL DEFAULT false);
		CREATE TABLE shipments (id bigserial PRIMARY KEY, mode text NOT NULL, order_id text NOT NULL);
		CREATE TABLE provider_charges (id bigserial PRIMARY KEY, merchant text NOT NULL, order_id text NOT NULL, amount bigint NOT NULL, idempotency_key text);
		CREATE TABLE provider_refunds (id bigserial PRIMARY KEY, merchant text NOT NULL, order_id text NOT NULL, charge_id bigint NOT NULL, amount bigint NOT NULL, idempotency_key text)`)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = demoSchema
	cfg.MaxConns = 20
	return pgxpool.NewWithConfig(ctx, cfg)
}

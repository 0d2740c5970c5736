package main

import (
	"context"
	"errors"
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
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/shard"
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
	duration    time.Duration // stop submitting after this long; 0: submit every order
	seed        uint64
	keep        bool
	faults      faultConfig
	grace       time.Duration // how long an interrupted run waits for the orders in flight
	killEvery   int           // one order in killEvery kills the worker after its charge
	otlp        string        // the OTLP endpoint the workers export to; "": none
	shards      int           // PostgreSQL clusters, a shop on each; 1: one cluster, one shop
	citus       bool          // run on a Citus coordinator with two workers
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
	flag.DurationVar(&cfg.duration, "duration", 0, "stop submitting orders after this long (0: submit them all), then finish the ones in flight")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the faults' timing")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the throwaway PostgreSQL cluster and say how to connect to it")
	flag.DurationVar(&cfg.faults.pgCrashEvery, "pg-crash-every", 0, "crash-restart PostgreSQL (immediate mode) about this often")
	flag.DurationVar(&cfg.faults.pgDown, "pg-down", time.Second, "how long a crashed PostgreSQL stays down")
	flag.DurationVar(&cfg.faults.backendKillEvery, "backend-kill-every", 0, "terminate one PostgreSQL client backend about this often")
	flag.DurationVar(&cfg.faults.outageEvery, "outage-every", 0, "take PostgreSQL down for -outage about this often")
	flag.DurationVar(&cfg.faults.outage, "outage", 30*time.Second, "length of a PostgreSQL outage")
	flag.DurationVar(&cfg.faults.temporalEvery, "temporal-crash-every", 0, "SIGKILL and restart the Temporal dev server about this often (its state is kept in a file)")
	flag.DurationVar(&cfg.grace, "grace", 2*time.Minute, "how long an interrupted run waits for the orders in flight; its faults stop with its submissions")
	flag.IntVar(&cfg.shards, "shards", 1, "PostgreSQL clusters to shard the shops over by tenant, a shop on each (more than 1 runs oncekit's saga alone)")
	flag.DurationVar(&cfg.faults.shardCrashEvery, "shard-crash-every", 0, "with -shards, crash-restart the last shard's PostgreSQL (immediate mode) about this often, while the others go on")
	flag.DurationVar(&cfg.faults.shardDown, "shard-down", 5*time.Second, "how long a crashed shard stays down")
	flag.BoolVar(&cfg.citus, "citus", false, "run on a throwaway Citus cluster, a coordinator and two workers, with the shop's tables distributed by tenant beside the ledger's (needs the Citus tarball: docs/citus.md)")
	flag.DurationVar(&cfg.faults.citusWorkerCrashEvery, "citus-worker-crash-every", 0, "with -citus, crash-restart a Citus worker (immediate mode, each in turn) about this often")
	flag.DurationVar(&cfg.faults.citusWorkerDown, "citus-worker-down", 3*time.Second, "how long a crashed Citus worker stays down")
	flag.IntVar(&cfg.killEvery, "kill-every", 20, "one order in this many SIGKILLs the worker right after its charge (0: none)")
	flag.StringVar(&cfg.otlp, "otlp", os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"),
		"export the workers' metrics and traces to this OTLP/gRPC endpoint, such as http://localhost:4317 (default: OTEL_EXPORTER_OTLP_ENDPOINT; empty: export nothing)")
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

	if err := checkOTLP(cfg.otlp); err != nil {
		return demoReport{}, err
	}
	if cfg.shards > 1 && cfg.naive {
		fmt.Println("With -shards, the demo runs oncekit's saga alone: the naive one knows no tenants.")
		cfg.naive = false
	}
	if cfg.faults.shardCrashEvery > 0 && cfg.shards < 2 {
		return demoReport{}, errors.New("-shard-crash-every needs -shards 2 or more")
	}
	if cfg.faults.citusWorkerCrashEvery > 0 && !cfg.citus {
		return demoReport{}, errors.New("-citus-worker-crash-every needs -citus")
	}
	if cfg.citus && cfg.shards > 1 {
		return demoReport{}, errors.New("-citus and -shards exclude each other: Citus spreads one database over its workers itself")
	}
	tmp, err := devenv.Start(ctx, &devenv.Config{UIPort: cfg.uiPort, Progress: os.Stderr,
		PersistTemporal: cfg.faults.temporalEvery > 0, Keep: cfg.keep, Shards: cfg.shards, Citus: cfg.citus,
		// A crash of a server with fsync off loses commits that were acknowledged:
		// that would be PostgreSQL's failure, not the saga's.
		Durable: cfg.faults.pgCrashEvery > 0 || cfg.faults.outageEvery > 0 || cfg.faults.shardCrashEvery > 0 || cfg.faults.citusWorkerCrashEvery > 0})
	if err != nil {
		return demoReport{}, fmt.Errorf("start the servers: %w", err)
	}
	defer func() {
		_ = tmp.Close()
		if kept := tmp.KeptAt(); kept != "" {
			fmt.Println(kept)
		}
	}()
	if (cfg.faults.pgCrashEvery > 0 || cfg.faults.backendKillEvery > 0 || cfg.faults.outageEvery > 0) && !tmp.OwnsPostgres() {
		return demoReport{}, errors.New("faults in PostgreSQL need the demo's own server: unset DATABASE_URL")
	}
	if cfg.faults.temporalEvery > 0 && !tmp.OwnsTemporal() {
		return demoReport{}, errors.New("faults in Temporal need the demo's own dev server: unset TEMPORAL_ADDRESS")
	}
	fmt.Printf("PostgreSQL ready; Temporal at %s", tmp.TemporalAddress)
	if tmp.UIAddress != "" {
		fmt.Printf(", web UI at %s", tmp.UIAddress)
	}
	if cfg.otlp != "" {
		fmt.Printf("; workers export metrics and traces to %s", cfg.otlp)
	}
	fmt.Println()

	urls := tmp.ShardURLs
	if len(urls) == 0 {
		urls = []string{tmp.DatabaseURL}
	}
	tenants := demoTenants(len(urls), cfg.citus)
	var pools []*pgxpool.Pool
	for _, url := range urls {
		var p *pgxpool.Pool
		if err := retry(ctx, "set up the demo's schemas", func() (err error) {
			p, err = setupDatabase(ctx, url, tenants)
			return err
		}); err != nil {
			return demoReport{}, err
		}
		defer p.Close()
		pools = append(pools, p)
	}
	pool := pools[0] // the provider's, and the only one without -shards
	if len(urls) > 1 {
		fmt.Printf("Shards: %d PostgreSQL clusters, shop %s on shard %s, %s on %s, ...\n", len(urls), shardTenant(0), shardName(0), shardTenant(1), shardName(1))
	}
	var shards []shard.Shard
	for i, p := range pools {
		shards = append(shards, shard.Shard{Name: shardName(i), Pool: p})
	}
	router, err := shard.New(shards, demoPicker(len(shards)))
	if err != nil {
		return demoReport{}, err
	}
	providerURL, stopProvider, err := startProvider(pool, cfg.citus)
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
		envNamespace + "=" + tmp.Namespace, envProvider + "=" + providerURL, envQueue + "=" + queue, envMetrics + "=" + metricsDir,
		envOTLP + "=" + cfg.otlp}}
	if len(urls) > 1 {
		sup.env = append(sup.env, envShards+"="+shardsEnv(urls))
	}
	sup.start()
	defer sup.stop()

	c, err := client.Dial(client.Options{HostPort: tmp.TemporalAddress, Namespace: tmp.Namespace, Logger: devenv.QuietLogger(),
		Interceptors: []interceptor.ClientInterceptor{worker.ClientInterceptor()}})
	if err != nil {
		return demoReport{}, err
	}
	defer c.Close()

	orders := makeOrders(cfg.orders, queue, cfg.killEvery, tenants)
	modes := []string{"oncekit"}
	if cfg.naive {
		modes = append(modes, "naive")
	}
	fmt.Printf("Checking out %d orders through %d sagas. Faults per saga: worker SIGKILLed after %d charges, %d charge answers lost, %d shipments refused (%d refund answers lost), %d orders submitted twice\n",
		len(orders), len(modes), countIf(orders, func(o Order) bool { return o.KillAfterCharge }),
		countIf(orders, func(o Order) bool { return o.LoseChargeResponse }),
		countIf(orders, func(o Order) bool { return o.ShippingFails }),
		countIf(orders, func(o Order) bool { return o.LoseRefundResponse }), countTwice(len(orders)))
	counts := &faultCounts{injecting: cfg.faults.any()}
	faultCtx, stopFaults := context.WithCancel(context.WithoutCancel(ctx))
	faultsDone := make(chan struct{})
	if cfg.faults.any() {
		fmt.Printf("Injecting into the servers: %s\n", cfg.faults)
		go func() { defer close(faultsDone); injectFaults(faultCtx, tmp, cfg.faults, cfg.seed, counts) }()
	} else {
		close(faultsDone)
	}
	submitCtx := ctx
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		submitCtx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	// The faults stop with the submissions (the last order submitted, or the run
	// interrupted): the orders in flight then finish as they would once an outage is
	// over, instead of waiting out the retries' backoff under a storm that never ends.
	stopInjecting := func() { counts.stop(); stopFaults() }
	outcomes := checkout(submitCtx, c, queue, orders, modes, cfg.concurrency, sup, counts, pool, cfg.grace, stopInjecting)
	stopInjecting()
	<-faultsDone
	// The report reads the database after the faults; it waits out a restart in progress.
	reportCtx := context.WithoutCancel(ctx)
	var rep demoReport
	if err := retry(reportCtx, "count the outcomes in the database", func() (err error) {
		rep, err = report(reportCtx, pools, orders, modes, outcomes)
		return err
	}); err != nil {
		return demoReport{}, err
	}
	if err := retry(reportCtx, "check for leftovers", func() error { return rep.checkLeftovers(reportCtx, router, c) }); err != nil {
		return demoReport{}, err
	}
	if counts.any() {
		rep.faults, rep.injected, rep.injectedAtStop = counts.String(), counts.injected(), counts.stoppedAt()
	}
	fmt.Println()
	rep.print(os.Stdout, sup.restarts.Load(), time.Since(start))
	if len(urls) > 1 {
		printPace(os.Stdout, orders, outcomes["oncekit"], len(urls))
	}
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

// makeOrders gives orders to the shops in turn, and faults, the same for both sagas:
// one in twenty kills the worker right after its charge; one in ten loses the
// provider's answer to the charge; one in ten is refused by shipping (and compensated),
// half of those losing the answer to the refund; one in ten is submitted twice.
func makeOrders(n int, run string, killEvery int, tenants []string) []Order {
	orders := make([]Order, n)
	for i := range orders {
		tenant := tenants[i%len(tenants)]
		if tenant == defaultShop {
			tenant = ""
		}
		orders[i] = Order{Tenant: tenant,
			ID: fmt.Sprintf("%s-order-%03d", run, i+1), SKU: fmt.Sprintf("sku-%d", i%5), Qty: 1 + i%3, Amount: int64(1000 + 10*i),
			KillAfterCharge:    killEvery > 0 && i%killEvery == 1,
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

// checkout submits every order to every saga, at most concurrency at once, with a
// second submission for the orders marked for it, and waits for them. It calls
// stopFaults when the last order is submitted, or when ctx ends (an interrupt, or
// -duration): then it stops submitting, waits up to grace for the orders in flight, and
// reports the rest as unfinished.
func checkout(ctx context.Context, c client.Client, queue string, orders []Order, modes []string, concurrency int,
	sup *supervisor, counts *faultCounts, pool *pgxpool.Pool, grace time.Duration, stopFaults func()) map[string][]outcome {
	out := map[string][]outcome{}
	for _, m := range modes {
		out[m] = make([]outcome, len(orders))
		for i := range out[m] {
			out[m][i] = outcome{unsubmitted: true}
		}
	}
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	stopWaiting := context.AfterFunc(ctx, func() {
		stopped := "stopped submitting"
		if counts.injecting {
			stopped += " and injecting faults"
		}
		fmt.Printf("  %s; waiting up to %s for the orders in flight\n", stopped, grace)
		time.AfterFunc(grace, cancelWait)
	})
	defer stopWaiting()
	var done, submitted atomic.Int64
	total := len(orders) * len(modes)
	ticker := time.NewTicker(3 * time.Second)
	defer ticker.Stop()
	go func() {
		for range ticker.C {
			fmt.Printf("  %d/%d checkouts finished (%d submitted), worker restarted %d times%s\n", done.Load(), total, submitted.Load(), sup.restarts.Load(), counts.progress())
			pctx, cancel := context.WithTimeout(waitCtx, time.Second)
			if err := pool.Ping(pctx); err != nil && waitCtx.Err() == nil {
				fmt.Printf("  PostgreSQL is unreachable: %v\n", err)
			}
			if _, err := c.CheckHealth(pctx, nil); err != nil && waitCtx.Err() == nil {
				fmt.Printf("  Temporal is unreachable: %v\n", err)
			}
			cancel()
		}
	}()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
submit:
	for i, o := range orders {
		for _, mode := range modes {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break submit
			}
			submitted.Add(1)
			out[mode][i] = outcome{}
			wg.Go(func() {
				defer func() { <-sem }()
				out[mode][i] = runOrder(waitCtx, c, queue, mode, o, twice(i), counts)
				done.Add(1)
			})
		}
	}
	// Every order is submitted, or ctx ended: the faults stop, and the orders in flight
	// finish as they would once an outage is over.
	stopFaults()
	counts.submissionsStopped()
	if ctx.Err() == nil && counts.injecting {
		fmt.Println("  every order submitted; no more faults injected")
	}
	wg.Wait()
	fmt.Printf("  %d/%d checkouts finished (%d submitted), worker restarted %d times%s\n", done.Load(), total, submitted.Load(), sup.restarts.Load(), counts.progress())
	return out
}

func runOrder(ctx context.Context, c client.Client, queue, mode string, o Order, submitTwice bool, counts *faultCounts) outcome {
	wf := wfCheckout
	if mode == "naive" {
		wf = wfNaiveCheckout
	}
	ctx = keys.WithTenant(ctx, o.tenant())
	started := time.Now()
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
			err := startAndWait(ctx, c, id, client.StartWorkflowOptions{ID: id, TaskQueue: queue, WorkflowExecutionTimeout: 30 * time.Minute}, wf, o, counts)
			results[i] = outcome{shipped: err == nil, compensated: isCompensated(err), compensationFailed: isCompensationFailed(err),
				unfinished: ctx.Err() != nil && !isWorkflowEnd(err), err: err, id: id}
		})
	}
	wg.Wait()
	res := results[0]
	res.took = time.Since(started)
	if len(results) > 1 {
		res.secondAgrees = results[1].shipped == res.shipped && results[1].compensated == res.compensated && !results[1].unfinished
	}
	return res
}

// startAndWait starts the workflow (again, after an error that may have hidden its start:
// Temporal returns the run already started under the ID) and waits for its end, riding
// out a Temporal restart. It returns the workflow's own error, or ctx's.
func startAndWait(ctx context.Context, c client.Client, id string, opts client.StartWorkflowOptions, wf string, o Order, counts *faultCounts) error {
	backoff := 100 * time.Millisecond
	for {
		_, err := c.ExecuteWorkflow(ctx, opts, wf, o)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		counts.seen(fmt.Errorf("start %s: %w", id, err))
		sleepCtx(ctx, &backoff)
	}
	for {
		err := c.GetWorkflow(ctx, id, "").Get(ctx, nil)
		if err == nil || isWorkflowEnd(err) || ctx.Err() != nil {
			return err
		}
		counts.seen(fmt.Errorf("wait for %s: %w", id, err))
		sleepCtx(ctx, &backoff)
	}
}

func sleepCtx(ctx context.Context, backoff *time.Duration) {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	*backoff = min(*backoff*2, 5*time.Second)
}

// isWorkflowEnd reports whether err is how a workflow ended, rather than a failure to
// reach Temporal.
func isWorkflowEnd(err error) bool {
	var wee *temporal.WorkflowExecutionError
	return errors.As(err, &wee)
}

// retry runs step until it succeeds or ctx ends, riding out a restart or an outage of
// the servers; its error names the step.
func retry(ctx context.Context, step string, f func() error) error {
	deadline := time.Now().Add(2 * time.Minute)
	backoff := 200 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", step, err)
		}
		fmt.Printf("  %s failed (%v); retrying\n", step, err)
		sleepCtx(ctx, &backoff)
	}
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

func startProvider(pool *pgxpool.Pool, citus bool) (string, func(), error) {
	l, err := ledger.New(pool, &ledger.Config{Schema: providerSchema})
	if err != nil {
		return "", nil, err
	}
	p := &provider{pool: pool, ledger: l, lost: map[string]bool{}, statements: !citus}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: p.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// setupDatabase recreates the demo's schemas on url with the shop's tables, keyed by
// tenant and stocked for each of tenants. On Citus they are distributed by tenant beside
// the ledger's records, so each step's transaction stays on the node of its shop; the
// provider's tables, its own business, stay on the coordinator.
func setupDatabase(ctx context.Context, url string, tenants []string) (*pgxpool.Pool, error) {
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
		CREATE TABLE inventory (tenant text NOT NULL, mode text NOT NULL, sku text NOT NULL, available int NOT NULL, PRIMARY KEY (tenant, mode, sku));
		CREATE TABLE reservations (tenant text NOT NULL, id bigserial, mode text NOT NULL, order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL,
			released bool NOT NULL DEFAULT false, PRIMARY KEY (tenant, id));
		CREATE TABLE shipments (tenant text NOT NULL, id bigserial, mode text NOT NULL, order_id text NOT NULL, PRIMARY KEY (tenant, id));
		CREATE TABLE provider_charges (id bigserial PRIMARY KEY, merchant text NOT NULL, order_id text NOT NULL, amount bigint NOT NULL, idempotency_key text);
		CREATE TABLE provider_refunds (id bigserial PRIMARY KEY, merchant text NOT NULL, order_id text NOT NULL, charge_id bigint NOT NULL, amount bigint NOT NULL, idempotency_key text)`)
	if err != nil {
		return nil, err
	}
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return nil, err
	}
	if citus {
		for _, t := range []string{"inventory", "reservations", "shipments"} {
			if _, err := conn.Exec(ctx, `SELECT create_distributed_table($1, 'tenant', colocate_with => $2)`,
				demoSchema+"."+t, demoSchema+".idempotency_records"); err != nil {
				return nil, fmt.Errorf("distribute %s: %w", t, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO `+demoSchema+`.inventory
		SELECT t, m, 'sku-' || i, 10000 FROM unnest($1::text[]) t, unnest(ARRAY['oncekit', 'naive']) m, generate_series(0, 4) i`, tenants); err != nil {
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

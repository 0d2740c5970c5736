package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/migrate"
)

// agents are the demo's agents, each with an inbox of its own: the oncekit polling
// agent, the naive one, and the oncekit agent on Temporal.
var agents = []string{oncekitAgent, naiveAgent, temporalAgent}

// demoSchema holds the demo's tables and oncekit's; each run recreates it.
const demoSchema = "oncekit_agent_demo"

// The environment of an agent process.
const (
	envRole   = "ONCEKIT_AGENT_ROLE"
	envDB     = "ONCEKIT_AGENT_DB"
	envEmail  = "ONCEKIT_AGENT_EMAIL_URL"
	envRefund = "ONCEKIT_AGENT_REFUND_URL"
	envSMTP   = "ONCEKIT_AGENT_SMTP"
	envSeed   = "ONCEKIT_AGENT_SEED"
)

type config struct {
	tickets   int
	processes int // agent processes per agent
	seed      uint64
	timeout   time.Duration
}

func main() {
	if role := os.Getenv(envRole); role != "" {
		if err := agentMain(role); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	flag.IntVar(&cfg.tickets, "tickets", 200, "tickets in each agent's inbox")
	flag.IntVar(&cfg.processes, "processes", 2, "agent processes per agent")
	flag.Uint64Var(&cfg.seed, "seed", 1, "the seed of the faults and the model's changes of mind")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent-demo:", err)
		os.Exit(1)
	}
	if err := rep.check(); err != nil {
		fmt.Fprintln(os.Stderr, "agent-demo:", err)
		os.Exit(1)
	}
}

// run starts PostgreSQL and the servers, seeds both inboxes, runs the agent processes
// until every delivery is handled, and reports.
func run(ctx context.Context, cfg config, out io.Writer) (*report, error) {
	start := time.Now()
	envr, err := devenv.Start(ctx, &devenv.Config{Progress: os.Stderr})
	if err != nil {
		return nil, err
	}
	defer func() { _ = envr.Close() }()
	pool, err := setupSchema(ctx, envr.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	srv, err := startServers(pool, cfg.seed)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	deliveries, err := seed(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "Handling %d tickets with 3 agents, %d processes each (%d deliveries each, tickets delivered twice included).\n",
		cfg.tickets, cfg.processes, deliveries)
	fmt.Fprintln(out, "Faults per agent: processes SIGKILLed after tool effects, answers lost after the servers acted, the model rewording on 10 % of retries; refunds of 100 or more need approval.")

	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	sup := &supervisor{cfg: cfg, env: []string{envDB + "=" + envr.DatabaseURL, envEmail + "=" + srv.email,
		envRefund + "=" + srv.refund, envSMTP + "=" + srv.smtp, envSeed + "=" + strconv.FormatUint(cfg.seed, 10),
		envTemporal + "=" + envr.TemporalAddress, envNamespace + "=" + envr.Namespace}}
	tc, err := client.Dial(client.Options{HostPort: envr.TemporalAddress, Namespace: envr.Namespace, Logger: devenv.QuietLogger()})
	if err != nil {
		return nil, err
	}
	defer tc.Close()
	l, g, err := operatorGuard(pool)
	_ = l
	if err != nil {
		return nil, err
	}
	var approvals approvalCount
	var wg sync.WaitGroup
	wg.Go(func() { approvals.operate(runCtx, g) })
	for _, name := range agents {
		for i := range cfg.processes {
			sup.start(runCtx, &wg, name, i)
		}
	}
	wg.Go(func() {
		if err := dispatch(runCtx, &env{name: temporalAgent, pool: pool, seed: cfg.seed}, tc); err != nil {
			sup.fail(err)
		}
	})
	err = waitDrained(runCtx, pool)
	cancel()
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("the inboxes were not drained: %w", err)
	}
	rep, err := collect(ctx, pool, cfg, sup, &approvals)
	if err != nil {
		return nil, err
	}
	rep.took = time.Since(start)
	rep.print(out)
	return rep, nil
}

func setupSchema(ctx context.Context, url string) (*pgxpool.Pool, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+demoSchema+" CASCADE"); err != nil {
		return nil, err
	}
	if _, err := migrate.Up(ctx, conn, demoSchema); err != nil {
		return nil, err
	}
	pool, err := connect(ctx, url)
	if err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, `
CREATE TABLE tickets (agent text NOT NULL, id int NOT NULL, customer text NOT NULL, kind text NOT NULL, amount int NOT NULL, PRIMARY KEY (agent, id));
CREATE TABLE deliveries (id bigserial PRIMARY KEY, agent text NOT NULL, ticket int NOT NULL, visible_at timestamptz NOT NULL DEFAULT now(), attempts int NOT NULL DEFAULT 0);
CREATE TABLE emails (id bigserial PRIMARY KEY, agent text NOT NULL, ticket int NOT NULL, detail text NOT NULL, idem_key text UNIQUE);
CREATE TABLE refunds (id bigserial PRIMARY KEY, agent text NOT NULL, ticket int NOT NULL, detail text NOT NULL, idem_key text UNIQUE);
CREATE TABLE smtp_messages (id bigserial PRIMARY KEY, agent text NOT NULL, ticket int NOT NULL, detail text NOT NULL, idem_key text UNIQUE);
CREATE TABLE faults (agent text NOT NULL, ticket int NOT NULL, fault text NOT NULL, PRIMARY KEY (agent, ticket, fault));
CREATE TABLE events (agent text NOT NULL, ticket int NOT NULL, kind text NOT NULL, detail text NOT NULL);
CREATE TABLE outcomes (agent text NOT NULL, ticket int NOT NULL, outcome text NOT NULL, PRIMARY KEY (agent, ticket));`)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = demoSchema
	return pgxpool.NewWithConfig(ctx, cfg)
}

// seed fills both inboxes with the same tickets; one in ten is delivered twice.
func seed(ctx context.Context, pool *pgxpool.Pool, cfg config) (int, error) {
	deliveries := 0
	for _, name := range agents {
		deliveries = 0
		b := &pgx.Batch{}
		for id := 1; id <= cfg.tickets; id++ {
			kind, amount := "question", 0
			if chance(cfg.seed, "", id, "kind") < 0.6 {
				kind, amount = "refund", 20+int(chance(cfg.seed, "", id, "amount")*180)
			}
			b.Queue(`INSERT INTO tickets (agent, id, customer, kind, amount) VALUES ($1, $2, $3, $4, $5)`,
				name, id, fmt.Sprintf("customer%d@example.com", id), kind, amount)
			times := 1
			if chance(cfg.seed, "", id, "twice") < 0.10 {
				times = 2
			}
			for range times {
				b.Queue(`INSERT INTO deliveries (agent, ticket) VALUES ($1, $2)`, name, id)
				deliveries++
			}
		}
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			return 0, err
		}
	}
	return deliveries, nil
}

func waitDrained(ctx context.Context, pool *pgxpool.Pool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM deliveries`).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d deliveries left: %w", left, ctx.Err())
		case <-t.C:
		}
	}
}

// supervisor runs the agent processes and restarts those that were killed.
type supervisor struct {
	cfg      config
	env      []string
	mu       sync.Mutex
	killed   map[string]int
	failures []error
}

func (s *supervisor) start(ctx context.Context, wg *sync.WaitGroup, name string, i int) {
	wg.Go(func() {
		for ctx.Err() == nil {
			self, err := os.Executable()
			if err != nil {
				s.fail(err)
				return
			}
			cmd := exec.Command(self)
			cmd.Env = append(os.Environ(), append(s.env, envRole+"="+name)...)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				s.fail(err)
				return
			}
			stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Signal(syscall.SIGTERM) })
			err = cmd.Wait()
			stop()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				if st, ok := exit.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGKILL {
					s.mu.Lock()
					if s.killed == nil {
						s.killed = map[string]int{}
					}
					s.killed[name]++
					s.mu.Unlock()
					continue
				}
			}
			if err != nil && ctx.Err() == nil {
				s.fail(fmt.Errorf("%s agent process %d: %w", name, i, err))
				return
			}
		}
	})
}

func (s *supervisor) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, err)
}

// agentMain is an agent process: it polls its inbox until SIGTERM.
func agentMain(role string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := connect(ctx, os.Getenv(envDB))
	if err != nil {
		return err
	}
	defer pool.Close()
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	e := &env{name: role, pool: pool, seed: seed, email: os.Getenv(envEmail), refund: os.Getenv(envRefund), smtp: os.Getenv(envSMTP)}
	switch role {
	case naiveAgent:
		return e.loop(ctx, e.naive)
	case temporalAgent:
		return temporalWorkerMain(ctx, e)
	}
	a, err := newGuarded(e)
	if err != nil {
		return err
	}
	return a.loop(ctx, a.handle)
}

// approvalCount counts the operator's decisions.
type approvalCount struct{ approved, rejected atomic.Int64 }

// operate is the operator: it approves refunds up to 150 and rejects larger ones.
func (c *approvalCount) operate(ctx context.Context, g *agent.Guard) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		waiting, err := g.Waiting(ctx, tenant, 100)
		if err != nil {
			continue
		}
		for _, f := range waiting {
			var args struct{ Amount int }
			_ = json.Unmarshal(f.Args, &args)
			if args.Amount <= 150 {
				if g.Approve(ctx, f, "operator@example.com", "within the refund policy") == nil {
					c.approved.Add(1)
				}
			} else if g.Reject(ctx, f, "operator@example.com", "over the refund policy") == nil {
				c.rejected.Add(1)
			}
		}
	}
}

package transfer_test

import (
	"context"
	"errors"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/samples/transfer"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

func TestMain(m *testing.M) {
	testsuite.RunWorkerProcess(map[string]testsuite.WorkerMain{"transfer": runWorker})
	pgtest.Main(m)
}

// world is what the tests share: the activities call one bank per process, so every
// transfer of the package runs against it, each with its own accounts and faults.
type world struct {
	pool   *pgxpool.Pool
	schema string
	l      *ledger.Ledger
	bank   *transfer.Bank
	faults sync.Map // reference ID -> *faults
}

// faults are a transfer's faults at the bank, counted down as they strike.
type faults struct {
	mu sync.Mutex
	// lose counts, per kind of movement, the answers still to lose after moving.
	lose map[string]int
	// down counts, per kind of movement, the calls still to refuse before moving.
	down map[string]int
	// accept makes StepWithError succeed.
	accept bool
}

func (f *faults) strike(m map[string]int, kind string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m[kind] > 0 {
		m[kind]--
		return true
	}
	return false
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, transfer.BankSchema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	w := &world{pool: pool, schema: schema, l: l}
	w.bank = &transfer.Bank{Pool: pool,
		FaultFunc: func(ctx context.Context, m transfer.Movement, move func(context.Context) (int64, error)) (int64, error) {
			f := w.faultsOf(m.Reference)
			if f.strike(f.down, m.Kind) {
				return 0, errors.New("bank: unreachable")
			}
			id, err := move(ctx)
			if err == nil && f.strike(f.lose, m.Kind) {
				return 0, errors.New("bank: connection reset before the answer")
			}
			return id, err
		},
		RefuseFunc: func(d transfer.TransferDetails) bool { return !w.faultsOf(d.ReferenceID).accept },
	}
	transfer.UseBank(w.bank)
	return w
}

func (w *world) faultsOf(ref string) *faults {
	f, _ := w.faults.LoadOrStore(ref, &faults{lose: map[string]int{}, down: map[string]int{}})
	return f.(*faults)
}

const amount = 100

// details opens the transfer's accounts: 1000 in the source, 0 in the target.
func (w *world) details(t *testing.T, ref string) transfer.TransferDetails {
	t.Helper()
	d := transfer.TransferDetails{Amount: amount, FromAccount: ref + "-from", ToAccount: ref + "-to", ReferenceID: ref}
	require.NoError(t, w.bank.Open(context.Background(), d.FromAccount, 1000))
	require.NoError(t, w.bank.Open(context.Background(), d.ToAccount, 0))
	return d
}

// money is what a transfer left at the bank: each account's change, and the movements.
type money struct {
	From, To  float32
	Movements map[string]int
}

func (w *world) money(t *testing.T, d transfer.TransferDetails) money {
	t.Helper()
	ctx := context.Background()
	from, err := w.bank.Balance(ctx, d.FromAccount)
	require.NoError(t, err)
	to, err := w.bank.Balance(ctx, d.ToAccount)
	require.NoError(t, err)
	mv, err := w.bank.Movements(ctx, d.ReferenceID)
	require.NoError(t, err)
	return money{From: from - 1000, To: to, Movements: mv}
}

// moved is true when the transfer's money moved once, restored when it is back.
func (m money) moved() bool    { return m.From == -amount && m.To == amount }
func (m money) restored() bool { return m.From == 0 && m.To == 0 }

// report says how a workflow ended: "completed", or its error's type.
func report(err error) string {
	if err == nil {
		return "completed"
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) && strings.HasPrefix(app.Type(), "oncekit.saga.") {
		return strings.TrimPrefix(app.Type(), "oncekit.saga.")
	}
	return "failed"
}

// agrees reports whether what the workflow reported is what the money shows.
func agrees(reported string, m money) bool {
	if reported == "completed" {
		return m.moved()
	}
	return m.restored()
}

func TestTransfer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	t.Run("CrashPointMatrix", func(t *testing.T) {
		t.Parallel()
		// Each money movement of the port passes the crash check at every point, the crash
		// after the bank moved and before the ledger recorded it included.
		for name, fn := range map[string]func(context.Context, transfer.TransferDetails) error{
			"Withdraw": transfer.Withdraw, "Deposit": transfer.Deposit,
		} {
			d := w.details(t, "matrix-"+name)
			testsuite.CheckCrashBeforeComplete(t, testsuite.Case[transfer.TransferDetails]{Name: name, Activity: fn, Request: d, Ledger: w.l,
				Effects: func(ctx context.Context) (int, error) {
					mv, err := w.bank.Movements(ctx, d.ReferenceID)
					return mv[strings.ToLower(name)], err
				}})
		}
	})
	t.Run("WhereOncekitStillWins", func(t *testing.T) { w.whereOncekitStillWins(t) })
	t.Run("KilledWorkers", func(t *testing.T) { w.killedWorkers(t) })
}

// runInMemory runs one workflow of version in Temporal's in-memory environment.
func (w *world) runInMemory(version, workflowID string, d transfer.TransferDetails) error {
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: w.l, Tenant: "bank"})
	registerAll(env, w.bank)
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: workflowID})
	env.ExecuteWorkflow(workflowOf(version), d)
	if !env.IsWorkflowCompleted() {
		return errors.New("the workflow did not complete")
	}
	return env.GetWorkflowError()
}

// The faults under which a careful plain-Temporal user, who already sends the bank an
// idempotency key, still ends with money and reports that disagree: a step whose outcome
// stays unknown (the bank moved, every answer was lost), a transfer submitted again after
// it was compensated, and an outage of the bank during a compensation.
func (w *world) whereOncekitStillWins(t *testing.T) {
	t.Parallel()
	type row struct {
		reported string
		money    money
	}
	scenarios := []struct {
		name   string
		faults func(f *faults)
		// again submits a second workflow for the transfer, once its last step works.
		again bool
		// want is what each version reports and leaves.
		want map[string]row
	}{
		{
			name:   "AnswerLostOnEveryWithdrawal",
			faults: func(f *faults) { f.lose["withdraw"], f.accept = 3, true },
			want: map[string]row{
				plain:   {"failed", money{-3 * amount, 0, map[string]int{"withdraw": 3}}},
				careful: {"failed", money{-amount, 0, map[string]int{"withdraw": 1}}},
				oncekit: {"Compensated", money{0, 0, map[string]int{"withdraw": 1, "withdraw-compensation": 1}}},
			},
		},
		{
			name:   "ResubmittedAfterCompensation",
			faults: func(*faults) {},
			again:  true,
			want: map[string]row{
				plain:   {"completed", money{-amount, amount, map[string]int{"withdraw": 2, "deposit": 2, "withdraw-compensation": 1, "deposit-compensation": 1}}},
				careful: {"completed", money{0, 0, map[string]int{"withdraw": 1, "deposit": 1, "withdraw-compensation": 1, "deposit-compensation": 1}}},
				oncekit: {"Compensated", money{0, 0, map[string]int{"withdraw": 1, "deposit": 1, "withdraw-compensation": 1, "deposit-compensation": 1}}},
			},
		},
		{
			name:   "OutageDuringCompensation",
			faults: func(f *faults) { f.down["deposit-compensation"] = 5 },
			want: map[string]row{
				plain:   {"failed", money{0, amount, map[string]int{"withdraw": 1, "deposit": 1, "withdraw-compensation": 1}}},
				careful: {"failed", money{0, amount, map[string]int{"withdraw": 1, "deposit": 1, "withdraw-compensation": 1}}},
				oncekit: {"Compensated", money{0, 0, map[string]int{"withdraw": 1, "deposit": 1, "withdraw-compensation": 1, "deposit-compensation": 1}}},
			},
		},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			for _, version := range versions {
				ref := "wins-" + sc.name + "-" + version
				d := w.details(t, ref)
				f := w.faultsOf(ref)
				sc.faults(f)
				err := w.runInMemory(version, ref+"-1", d)
				if sc.again {
					f.mu.Lock()
					f.accept = true
					f.mu.Unlock()
					err = w.runInMemory(version, ref+"-2", d)
				}
				got := row{report(err), w.money(t, d)}
				t.Logf("%-28s %-8s reported %-12s money from %+7.2f to %+7.2f, movements %v, agrees %v",
					sc.name, version, got.reported, got.money.From, got.money.To, got.money.Movements, agrees(got.reported, got.money))
				require.Equal(t, sc.want[version], got, "%s: %v", version, err)
				if version == oncekit {
					require.True(t, agrees(got.reported, got.money))
				}
			}
		})
	}
}

// Environment of the worker processes.
const (
	envTemporal = "TRANSFER_TEMPORAL"
	envDB       = "TRANSFER_DB"
	envSchema   = "TRANSFER_SCHEMA"
	envQueue    = "TRANSFER_QUEUE"
	envDoomed   = "TRANSFER_DOOMED" // "1": stop after each transfer's chosen movement until killed
)

// killAfter is the kind of movement after which a transfer's first worker is killed: the
// end of its reference ID.
func killAfter(ref, kind string) bool { return strings.HasSuffix(ref, "/"+kind) }

func runWorker(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(envSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: os.Getenv(envSchema)})
	if err != nil {
		return err
	}
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l})
	if err != nil {
		return err
	}
	c, err := client.Dial(client.Options{HostPort: os.Getenv(envTemporal), Logger: devenv.QuietLogger(), Plugins: []client.Plugin{plugin}})
	if err != nil {
		return err
	}
	defer c.Close()
	doomed := os.Getenv(envDoomed) == "1"
	bank := &transfer.Bank{Pool: pool,
		RefuseFunc: func(d transfer.TransferDetails) bool { return !strings.Contains(d.ReferenceID, "/completes/") },
		FaultFunc: func(ctx context.Context, m transfer.Movement, move func(context.Context) (int64, error)) (int64, error) {
			id, err := move(ctx)
			if err == nil && doomed && killAfter(m.Reference, m.Kind) {
				testsuite.Mark("moved " + m.Reference)
				<-ctx.Done() // the parent kills the process here
				return 0, ctx.Err()
			}
			return id, err
		},
	}
	transfer.UseBank(bank)
	w := tworker.New(c, os.Getenv(envQueue), tworker.Options{})
	registerAll(w, bank)
	if err := w.Start(); err != nil {
		return err
	}
	testsuite.Mark("ready")
	<-ctx.Done()
	w.Stop()
	return nil
}

// Every version on a real Temporal dev server, under the same SIGKILLs: a worker is
// killed right after the bank made one of a transfer's movements (each movement in turn,
// for transfers that complete and transfers the last step refuses), and a second worker
// finishes the transfers once the lost attempts time out (a minute, as in the sample).
// Counted at the bank: movements beyond the ones the transfer needs, transfers whose
// money disagrees with what the workflow reported.
func (w *world) killedWorkers(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cases := []struct{ outcome, kill string }{
		{"completes", "withdraw"},
		{"completes", "deposit"},
		{"refused", "withdraw"},
		{"refused", "deposit"},
		{"refused", "deposit-compensation"},
		{"refused", "withdraw-compensation"},
	}
	type tally struct{ transfers, extra, disagree int }
	var mu sync.Mutex
	tallies := map[string]tally{}
	t.Cleanup(func() {
		// The figures of the comparison, once every version has run.
		for _, version := range versions {
			tl := tallies[version]
			t.Logf("killed workers: %-8s %d transfers, %d SIGKILLs, %d movements beyond the ones needed, %d transfers whose money disagrees with the report",
				version, tl.transfers, tl.transfers, tl.extra, tl.disagree)
		}
	})
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			queue := "transfer-" + version + "-" + w.schema
			env := map[string]string{envTemporal: srv.TemporalAddress, envDB: pgtest.URL(t), envSchema: w.schema, envQueue: queue, envDoomed: "1"}
			doomed := testsuite.StartWorkerProcess(t, "transfer", env)
			doomed.WaitFor(t, "ready", time.Minute)
			runs := map[string]client.WorkflowRun{}
			details := map[string]transfer.TransferDetails{}
			var marks []string
			for _, tc := range cases {
				ref := version + "/" + tc.outcome + "/" + tc.kill
				d := w.details(t, ref)
				run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{TaskQueue: queue,
					WorkflowExecutionTimeout: 10 * time.Minute}, workflowOf(version), d)
				require.NoError(t, err)
				runs[ref], details[ref] = run, d
				marks = append(marks, "moved "+ref)
			}
			doomed.WaitForAll(t, marks, 3*time.Minute)
			require.True(t, doomed.Kill())

			env[envDoomed] = ""
			survivor := testsuite.StartWorkerProcess(t, "transfer", env)
			survivor.WaitFor(t, "ready", time.Minute)
			var tl tally
			refs := make([]string, 0, len(runs))
			for ref := range runs {
				refs = append(refs, ref)
			}
			sort.Strings(refs)
			for _, ref := range refs {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				err := runs[ref].Get(ctx, nil)
				cancel()
				require.False(t, errors.Is(err, context.DeadlineExceeded), "%s did not finish", ref)
				m := w.money(t, details[ref])
				need := 2
				if strings.Contains(ref, "/refused/") {
					need = 4
				}
				total := 0
				for _, n := range m.Movements {
					total += n
				}
				reported := report(err)
				tl.transfers++
				tl.extra += total - need
				if !agrees(reported, m) {
					tl.disagree++
				}
				t.Logf("%-40s reported %-12s money from %+7.2f to %+7.2f, movements %v", ref, reported, m.From, m.To, m.Movements)
			}
			mu.Lock()
			tallies[version] = tl
			mu.Unlock()
			switch version {
			case plain:
				require.Equal(t, tally{len(cases), len(cases), tl.disagree}, tl, "the sample repeats each movement its killed worker made")
			default:
				require.Equal(t, tally{len(cases), 0, 0}, tl, "every movement once, and the money agrees with the report")
			}
		})
	}
}

package transfer_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
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

const opening = 1000

// outcome is what a transfer left at the bank.
type outcome struct {
	From, To  int64
	Movements int
}

func setup(t *testing.T) (*pgxpool.Pool, string, *ledger.Ledger, *transfer.Bank) {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, transfer.BankSchema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	return pool, schema, l, &transfer.Bank{Pool: pool}
}

func details(t *testing.T, bank *transfer.Bank, ref string, reject bool) transfer.TransferDetails {
	t.Helper()
	d := transfer.TransferDetails{Amount: 100, FromAccount: ref + "-from", ToAccount: ref + "-to", ReferenceID: ref, Reject: reject}
	require.NoError(t, bank.Open(context.Background(), d.FromAccount, opening))
	require.NoError(t, bank.Open(context.Background(), d.ToAccount, 0))
	return d
}

func outcomeOf(t *testing.T, bank *transfer.Bank, d transfer.TransferDetails) outcome {
	t.Helper()
	ctx := context.Background()
	var o outcome
	var err error
	o.From, err = bank.Balance(ctx, d.FromAccount)
	require.NoError(t, err)
	o.To, err = bank.Balance(ctx, d.ToAccount)
	require.NoError(t, err)
	o.Movements, err = bank.Movements(ctx, d.ReferenceID)
	require.NoError(t, err)
	return o
}

// What each version leaves when the first withdraw attempt's worker dies after the bank
// moved the money: the port moves every amount once; the sample withdraws twice.
var want = map[string]map[bool]outcome{
	transfer.Workflow: {
		false: {From: opening - 100, To: 100, Movements: 2},
		true:  {From: opening, To: 0, Movements: 4}, // withdraw, deposit, and both undone
	},
	transfer.PlainWorkflow: {
		false: {From: opening - 200, To: 100, Movements: 3},
		true:  {From: opening - 100, To: 0, Movements: 5}, // one withdraw is never refunded
	},
}

// Both versions in Temporal's in-memory environment, the first withdraw attempt crashed
// after the bank moved the money.
func TestTransfer_InMemoryCrash(t *testing.T) {
	t.Parallel()
	_, _, l, bank := setup(t)
	for _, wf := range []string{transfer.Workflow, transfer.PlainWorkflow} {
		for _, reject := range []bool{false, true} {
			ref := fmt.Sprintf("%s-%v", wf, reject)
			t.Run(ref, func(t *testing.T) {
				faults := testsuite.NewFaultPlan().CrashAfterEffect(transfer.Withdraw).CrashAfterEffect(transfer.PlainPrefix + transfer.Withdraw)
				env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l, Faults: faults})
				transfer.Register(env, &transfer.Activities{Bank: bank})
				d := details(t, bank, ref, reject)
				env.ExecuteWorkflow(wf, d)
				require.True(t, env.IsWorkflowCompleted())
				require.Equal(t, reject, env.GetWorkflowError() != nil, "%v", env.GetWorkflowError())
				require.Len(t, faults.Injected(), 1)
				require.Equal(t, want[wf][reject], outcomeOf(t, bank, d))
			})
		}
	}
}

// Each money movement of the port passes the crash checks at every point, including a
// crash after the bank moved and before the ledger recorded it.
func TestTransfer_CrashPointMatrix(t *testing.T) {
	t.Parallel()
	_, _, l, bank := setup(t)
	a := &transfer.Activities{Bank: bank}
	for name, fn := range map[string]func(context.Context, transfer.TransferDetails) error{
		transfer.Withdraw: a.Withdraw, transfer.Deposit: a.Deposit,
	} {
		d := details(t, bank, "matrix-"+name, false)
		testsuite.CheckCrashBeforeComplete(t, testsuite.Case[transfer.TransferDetails]{Name: name, Activity: fn, Request: d, Ledger: l,
			Effects: func(ctx context.Context) (int, error) { return bank.Movements(ctx, d.ReferenceID) }})
	}
}

// Environment of the worker process.
const (
	envTemporal = "TRANSFER_TEMPORAL"
	envDB       = "TRANSFER_DB"
	envSchema   = "TRANSFER_SCHEMA"
	envQueue    = "TRANSFER_QUEUE"
	envCrash    = "TRANSFER_CRASH" // the activity that blocks after its movement until killed
)

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
	w := tworker.New(c, os.Getenv(envQueue), tworker.Options{})
	crash := os.Getenv(envCrash)
	transfer.Register(w, &transfer.Activities{Bank: &transfer.Bank{Pool: pool}, AfterMove: func(ctx context.Context, name string) {
		if name == crash {
			testsuite.Mark("moved " + name)
			<-ctx.Done() // the parent kills the process here
		}
	}})
	if err := w.Start(); err != nil {
		return err
	}
	testsuite.Mark("ready")
	<-ctx.Done()
	w.Stop()
	return nil
}

// Both versions on a real Temporal dev server, with the worker SIGKILLed after the bank
// moved the money of the first withdraw, and a second worker finishing the transfer.
func TestTransfer_RealServerKilledWorker(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	_, schema, _, bank := setup(t)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	for _, wf := range []string{transfer.Workflow, transfer.PlainWorkflow} {
		for _, reject := range []bool{false, true} {
			ref := fmt.Sprintf("kill-%s-%v", wf, reject)
			t.Run(ref, func(t *testing.T) {
				t.Parallel()
				d := details(t, bank, ref, reject)
				withdraw := transfer.Withdraw
				if wf == transfer.PlainWorkflow {
					withdraw = transfer.PlainPrefix + withdraw
				}
				env := map[string]string{envTemporal: srv.TemporalAddress, envDB: pgtest.URL(t), envSchema: schema, envQueue: ref, envCrash: withdraw}
				doomed := testsuite.StartWorkerProcess(t, "transfer", env)
				doomed.WaitFor(t, "ready", time.Minute)
				ctx := context.Background()
				run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: ref, WorkflowExecutionTimeout: 2 * time.Minute}, wf, d)
				require.NoError(t, err)
				doomed.WaitFor(t, "moved "+withdraw, time.Minute)
				require.True(t, doomed.Kill())

				env[envCrash] = ""
				survivor := testsuite.StartWorkerProcess(t, "transfer", env)
				survivor.WaitFor(t, "ready", time.Minute)
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				err = run.Get(wctx, nil)
				require.Equal(t, reject, err != nil, "%v", err)
				require.Equal(t, want[wf][reject], outcomeOf(t, bank, d))
			})
		}
	}
}

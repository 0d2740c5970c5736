package testsuite_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// A workflow activity completes its effect and its worker is SIGKILLed before it reports
// completion; a second worker picks up the retry after the timeout. Guarded by oncekit,
// the effect exists once. The same crash on the plain activity, in the same test, leaves
// two: the fault was real. An External activity that does not send its downstream key is
// killed after the provider charged and before the ledger recorded it: the re-drive
// charges again, as the in-memory check at testsuite.AfterCall predicts.
func TestCrashBeforeComplete_RealServerKilledWorker(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, effectsSchema)
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger()})
	require.NoError(t, err)
	t.Cleanup(c.Close) // the subtests run in parallel, after this function returns

	for _, tc := range []struct {
		activity, table string
		want            int
	}{
		{guardedLocal, "reservations", 1},
		{plainLocal, "reservations", 2},
		{guardedExternal, "provider_charges", 1},
		{plainExternal, "provider_charges", 2},
		{wrongKeyExternal, "provider_charges", 2}, // what the in-memory AfterCall check catches
	} {
		t.Run(tc.activity, func(t *testing.T) {
			t.Parallel()
			queue := "crash-" + tc.activity + "-" + schema
			env := map[string]string{envTemporal: srv.TemporalAddress, envDB: pgtest.URL(t), envSchema: schema, envQueue: queue}
			o := order{OrderID: tc.activity, Amount: 4200}

			env[envCrash] = "1"
			doomed := testsuite.StartWorkerProcess(t, "crash", env)
			doomed.WaitFor(t, "ready", time.Minute)
			run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, WorkflowExecutionTimeout: 2 * time.Minute},
				"crash.one", tc.activity, o)
			require.NoError(t, err)
			doomed.WaitFor(t, "effect "+tc.activity, time.Minute)
			require.True(t, doomed.Kill(), "the worker was running when it was killed")
			require.True(t, doomed.Killed())

			env[envCrash] = "0"
			survivor := testsuite.StartWorkerProcess(t, "crash", env)
			survivor.WaitFor(t, "ready", time.Minute)
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			require.NoError(t, run.Get(wctx, nil), "the retried attempt completes on the second worker")
			testsuite.RequireCount(t.Context(), t, pool, tc.want, "SELECT count(*) FROM "+tc.table+" WHERE order_id = $1", tc.activity)
		})
	}
}

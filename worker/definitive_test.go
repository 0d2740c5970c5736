package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/testsuite"
	"github.com/oncekit/oncekit/worker"
)

// An activity that does not go through activity.Do or External and returns
// activity.Definitive, bare or wrapped, fails once: the plugin makes it the same
// non-retryable ApplicationError, typed by its code, that activity.Do returns. A saga
// step failing so runs once and is compensated, instead of running for every attempt
// its retry policy allows.
func TestWorker_DefinitiveFromPlainActivity(t *testing.T) {
	t.Parallel()
	srv := testsuite.StartDevServer(t)
	pool, schema := pgtest.NewSchema(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	plugin, err := worker.NewPlugin(worker.Config{Ledger: l})
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: srv.TemporalAddress, Namespace: srv.Namespace, Logger: devenv.QuietLogger(),
		Plugins: []client.Plugin{plugin}})
	require.NoError(t, err)
	defer c.Close()

	for _, tc := range []struct {
		name string
		fail func() error
	}{
		{"Bare", func() error { return activity.Definitive("card_declined", "the card was declined") }},
		{"Wrapped", func() error {
			return fmt.Errorf("charge: %w", activity.Definitive("card_declined", "the card was declined"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reserved, charged, released atomic.Int32
			reserve := func(context.Context, string) error { reserved.Add(1); return nil }
			charge := func(context.Context, string) error { charged.Add(1); return tc.fail() }
			release := func(context.Context, string) error { released.Add(1); return nil }
			wf := func(ctx workflow.Context, order string) (string, error) {
				key, err := keys.Business("order", order)
				if err != nil {
					return "", err
				}
				return saga.Run(ctx, &saga.Opts{Key: key, Request: order}, func(ctx workflow.Context, s *saga.Saga) (string, error) {
					// Eight quick attempts: without the plugin's mapping the step would
					// take all of them.
					ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
						RetryPolicy: &temporal.RetryPolicy{InitialInterval: 10 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 8}})
					if err := s.Do(ctx, saga.Step{Name: "reserve", Activity: "reserve", Args: []any{order}, Compensation: "release"}, nil); err != nil {
						return "", err
					}
					if err := s.Do(ctx, saga.Step{Name: "charge", Activity: "charge", Args: []any{order}}, nil); err != nil {
						return "", err
					}
					return "paid", nil
				})
			}
			queue := "definitive-" + tc.name
			w := tworker.New(c, queue, tworker.Options{})
			w.RegisterWorkflowWithOptions(wf, workflow.RegisterOptions{Name: "checkout"})
			w.RegisterActivityWithOptions(reserve, tactivity.RegisterOptions{Name: "reserve"})
			w.RegisterActivityWithOptions(charge, tactivity.RegisterOptions{Name: "charge"})
			w.RegisterActivityWithOptions(release, tactivity.RegisterOptions{Name: "release"})
			require.NoError(t, w.Start())
			defer w.Stop()

			run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{TaskQueue: queue, WorkflowExecutionTimeout: time.Minute},
				"checkout", "order-"+tc.name)
			require.NoError(t, err)
			err = run.Get(ctx, nil)
			require.Error(t, err)
			require.Equal(t, int32(1), charged.Load(), "the definitively failed step ran more than once")
			app := applicationError(err, "card_declined")
			require.NotNil(t, app, "no ApplicationError of type card_declined in %v", err)
			require.True(t, app.NonRetryable(), "%v", err)
			require.Equal(t, int32(1), reserved.Load())
			require.Equal(t, int32(1), released.Load(), "the saga did not compensate")
		})
	}
}

// applicationError returns the first ApplicationError of type typ in err's chain, or nil.
func applicationError(err error, typ string) *temporal.ApplicationError {
	for ; err != nil; err = errors.Unwrap(err) {
		var app *temporal.ApplicationError
		if errors.As(err, &app) && app.Type() == typ {
			return app
		}
	}
	return nil
}

package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/testsuite"
)

// PostgreSQL restarts while a dispatcher runs: nothing is lost, and every event is booked
// once. Not parallel: it restarts the package's cluster.
func TestOutbox_PostgresRestartMidDispatch(t *testing.T) {
	cluster := pgtest.OwnCluster(t)
	b := setup(t)
	for i := range 150 {
		b.produce(t, fmt.Sprintf("acc-%d", i%5), int64(i))
	}
	var mu sync.Mutex
	var errs []error
	d := b.dispatcher(t, outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		time.Sleep(time.Millisecond) // slow enough that the restart lands mid-dispatch
		return b.consume(ctx, e)
	}), &outbox.DispatcherConfig{BatchSize: 20, PollInterval: 50 * time.Millisecond, ErrorFunc: func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Eventually(t, func() bool {
		n, err := testsuite.Count(context.Background(), b.pool, `SELECT count(*) FROM statements`)
		return err == nil && n > 0
	}, 30*time.Second, 5*time.Millisecond, "dispatch started")

	require.NoError(t, cluster.Restart(context.Background()))
	require.Eventually(t, func() bool { return b.pool.Ping(context.Background()) == nil }, 30*time.Second, 50*time.Millisecond)
	for i := range 50 {
		b.produce(t, fmt.Sprintf("acc-%d", i%5), int64(1000+i))
	}
	require.Eventually(t, func() bool {
		st, err := b.out.Stats(context.Background())
		return err == nil && st.Published == 200
	}, time.Minute, 20*time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	testsuite.RequireCount(t.Context(), t, b.pool, 200, `SELECT count(DISTINCT event_id) FROM statements`)
	testsuite.RequireCount(t.Context(), t, b.pool, 200, `SELECT count(*) FROM statements`)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, errs, "the dispatcher saw the restart and recovered from it")
}

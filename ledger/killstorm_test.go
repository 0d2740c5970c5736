package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// Backends are terminated every few milliseconds while workers call Do on fresh keys in
// every mode, on a durable cluster: PostgreSQL may send the FATAL after a commit became
// durable. No call that committed may answer with anything but success or an unknown
// outcome; every call that answered "failed" committed nothing; and every unknown
// outcome is settled by a retry with the same key, which runs the mutation at most once
// more in all. ONCEKIT_KILLSTORM_CALLS sets the number of calls (400).
func TestDo_KillStormNeverReportsACommitAsFailed(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		t.Skip("the storm runs on a cluster of its own")
	}
	calls := 400
	if s := os.Getenv("ONCEKIT_KILLSTORM_CALLS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		calls = n
	}
	ctx := context.Background()
	c := pgtest.ExtraCluster(t)
	pool, schema := pgtest.NewSchemaOn(t, c.ConnString())
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, item text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)
	victims := pgtest.PoolOn(t, c.ConnString(), schema, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["application_name"] = "oncekit_storm"
		cfg.MaxConns = 8
	})
	l, err := ledger.New(victims, &ledger.Config{Schema: schema})
	require.NoError(t, err)

	stop := make(chan struct{})
	killed := 0
	var killer sync.WaitGroup
	killer.Add(1)
	go func() {
		defer killer.Done()
		for {
			t := time.NewTimer(time.Duration(500+rand.IntN(2500)) * time.Microsecond)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM (
				SELECT pid FROM pg_stat_activity WHERE application_name = 'oncekit_storm' AND state <> 'idle'
				ORDER BY random() LIMIT 1) s`).Scan(&ok); err == nil && ok {
				killed++
			}
		}
	}()

	type outcome struct {
		item string
		mode ledger.Mode
		err  error
	}
	results := make([]outcome, calls)
	var workers sync.WaitGroup
	next := make(chan int)
	for range 8 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for i := range next {
				o := order{Item: fmt.Sprintf("item-%d", i), Amount: int64(i)}
				mode := modes[i%len(modes)]
				_, err := l.Do(ctx, intent(t, "acme", o.Item, o), createOrder("acme", o), &ledger.DoOpts{Mode: mode})
				results[i] = outcome{item: o.Item, mode: mode, err: err}
			}
		}()
	}
	for i := range calls {
		next <- i
	}
	close(next)
	workers.Wait()
	close(stop)
	killer.Wait()

	rows := func(item string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE item = $1`, item).Scan(&n))
		return n
	}
	plain, unknown, lies := 0, 0, 0
	for _, r := range results {
		switch {
		case r.err == nil:
			require.Equal(t, 1, rows(r.item), "%s succeeded", r.item)
		case errors.Is(r.err, ledger.ErrOutcomeUnknown):
			unknown++
		default:
			plain++
			if rows(r.item) != 0 {
				lies++
				t.Errorf("%s in %s committed, and Do said: %v", r.item, r.mode, r.err)
			}
		}
	}
	// Every call is retried with its key, as a caller told "unknown" or "failed" does:
	// each intent ends with one effect.
	ll, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	for _, r := range results {
		if r.err == nil {
			continue
		}
		var o order
		_, err := fmt.Sscanf(r.item, "item-%d", &o.Amount)
		require.NoError(t, err)
		o.Item = r.item
		_, err = ll.Do(ctx, intent(t, "acme", o.Item, o), createOrder("acme", o), &ledger.DoOpts{Mode: r.mode, Wait: 10 * time.Second})
		require.NoError(t, err)
		require.Equal(t, 1, rows(r.item), "%s after its retry", r.item)
	}
	t.Logf("%d calls, %d backends terminated: %d unknown outcomes, %d plain errors, %d of them for committed calls",
		calls, killed, unknown, plain, lies)
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&total))
	require.Equal(t, calls, total)
}

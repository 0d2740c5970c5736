package ledger_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// On Citus, a guarded call on one tenant works on one node: the key's advisory lock is
// taken on the worker that holds the tenant's shard of the records, which also holds
// the tenant's shard of a business table colocated with them, so that the claim, the
// mutation and the record commit there together, without two-phase commit.
func TestCitus_GuardedCallStaysOnTheTenantsNode(t *testing.T) {
	t.Parallel()
	pgtest.CitusCluster(t)
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		_, b := setup(t, nil)
		ctx := context.Background()
		// Sessions that log, as notices, the commands Citus sends to workers.
		var mu sync.Mutex
		var sent []string
		prepared := func() bool {
			mu.Lock()
			defer mu.Unlock()
			found := false
			for _, m := range sent {
				found = found || strings.Contains(m, "PREPARE TRANSACTION")
			}
			sent = nil
			return found
		}
		pool := pgtest.Pool(t, b.schema, func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["citus.log_remote_commands"] = "on"
			c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
				mu.Lock()
				defer mu.Unlock()
				sent = append(sent, n.Message)
			}
		})
		l, err := ledger.New(pool, &ledger.Config{Schema: b.schema, Test: ledger.TestConfig{NowFunc: b.clock.Now}})
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `CREATE TABLE accounts (tenant text NOT NULL, id bigint NOT NULL, item text NOT NULL, PRIMARY KEY (tenant, id))`)
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `SELECT create_distributed_table('accounts', 'tenant', colocate_with => $1)`,
			pgx.Identifier{b.schema, "idempotency_records"}.Sanitize())
		require.NoError(t, err)
		var colocated bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)
			= (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idempotency_records'::regclass)`).Scan(&colocated))
		require.True(t, colocated, "a business table distributed with colocate_with the records shares their group")

		for _, tenant := range []string{"acme", "globex", "initech", "umbrella"} {
			var node int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT n.nodeid FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
				WHERE p.shardid = get_shard_id_for_distribution_column('accounts', $1::text)`, tenant).Scan(&node))

			inFn := make(chan int64, 1)
			done := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				_, err := l.Do(ctx, intent(t, tenant, "k-"+tenant, order{Item: "book"}), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					if _, err := tx.Exec(ctx, `INSERT INTO accounts (tenant, id, item) VALUES ($1::text, 1, 'book')`, tenant); err != nil {
						return ledger.Response{}, err
					}
					var gpid int64
					if err := tx.QueryRow(ctx, `SELECT citus_backend_gpid()`).Scan(&gpid); err != nil {
						return ledger.Response{}, err
					}
					inFn <- gpid
					<-done
					return ledger.Response{Code: 201}, nil
				}, &ledger.DoOpts{Mode: mode})
				errc <- err
			}()
			var gpid int64
			select {
			case gpid = <-inFn:
			case err := <-errc:
				t.Fatalf("Do returned before fn ran: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("fn did not run")
			}
			var lockNodes []int
			rows, err := b.pool.Query(ctx, `SELECT DISTINCT nodeid FROM citus_locks WHERE global_pid = $1 AND locktype = 'advisory' AND objsubid = 1 AND granted`, gpid)
			require.NoError(t, err)
			lockNodes, err = pgx.CollectRows(rows, pgx.RowTo[int])
			require.NoError(t, err)
			close(done)
			require.NoError(t, <-errc)
			if mode == ledger.ModeOptimistic {
				require.Empty(t, lockNodes, "the optimistic mode takes no lock")
			} else {
				require.Equal(t, []int{node}, lockNodes, "the lock of %s's key lives on its shard's node", tenant)
			}
			require.False(t, prepared(), "one node, one commit")
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE tenant = $1`, tenant).Scan(&n))
			require.Equal(t, 1, n)
		}

		// The check can fail: a transaction over two tenants on different nodes is
		// committed with two-phase commit.
		var tenants []string
		rows, err := b.pool.Query(ctx, `SELECT DISTINCT ON (p.groupid) t FROM (SELECT 'tenant-' || g AS t FROM generate_series(1, 64) g) ts
			JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('accounts', t)
			ORDER BY p.groupid, t`)
		require.NoError(t, err)
		tenants, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Len(t, tenants, 2, "a tenant on each worker")
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, tenant := range tenants {
				if _, err := tx.Exec(ctx, `INSERT INTO accounts (tenant, id, item) VALUES ($1::text, 2, 'pen')`, tenant); err != nil {
					return err
				}
			}
			return nil
		}))
		require.True(t, prepared())
	})
}

package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

// shardedBundle is a ledger on two shards: "a" on the test server, "b" on a cluster of
// its own that a test may crash.
type shardedBundle struct {
	router *shard.Router
	pools  map[string]*pgxpool.Pool
	b      *pgtest.Cluster
	clock  *pgtest.Clock
}

// tenantsOn lists n tenants that the router places on shard name.
func (sb *shardedBundle) tenantsOn(t testing.TB, name string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		tenant := fmt.Sprintf("tenant-%d", i)
		s, err := sb.router.For(tenant)
		require.NoError(t, err)
		if s.Name == name {
			out = append(out, tenant)
		}
	}
	return out
}

func setupSharded(t *testing.T, cfg *ledger.Config) (*ledger.Ledger, *shardedBundle) {
	t.Helper()
	s := pgtest.NewSharded(t, migrateLedger, ordersDDL)
	router, err := shard.New([]shard.Shard{{Name: "a", Pool: s.A}, {Name: "b", Pool: s.B}}, nil)
	require.NoError(t, err)
	clock := pgtest.NewClock(t, s.A)
	c := testConfig(cfg, s.Schema, clock)
	c.Test.NowFunc = clock.Now
	l, err := ledger.NewSharded(router, c)
	require.NoError(t, err)
	return l, &shardedBundle{router: router, pools: s.Pools, b: s.Cluster, clock: clock}
}

// Each tenant's record and business write land on its shard alone, a retry replays
// there, and the calls over many records see every shard.
func TestSharded_RoutesEachTenantToItsShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, sb := setupSharded(t, &ledger.Config{Retention: time.Hour})
	tenants := map[string][]string{"a": sb.tenantsOn(t, "a", 3), "b": sb.tenantsOn(t, "b", 3)}
	for name, ts := range tenants {
		for _, tenant := range ts {
			in := intent(t, tenant, "k-1", order{Item: "book", Amount: 1})
			res, err := l.Do(ctx, in, createOrder(tenant, order{Item: "book", Amount: 1}), nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			res, err = l.Do(ctx, in, createOrder(tenant, order{Item: "book", Amount: 1}), nil)
			require.NoError(t, err)
			require.True(t, res.Replayed, "the retry of %s replays on shard %s", tenant, name)
			for other, pool := range sb.pools {
				want := 0
				if other == name {
					want = 1
				}
				require.Equal(t, want, countOrders(t, pool, tenant), "orders of %s on shard %s", tenant, other)
				rec, err := l.Get(ctx, in.Scope, in.Key)
				require.NoError(t, err)
				require.Equal(t, ledger.StateCompleted, rec.State)
			}
		}
	}
	// The caller's transaction, opened on the tenant's pool.
	tenant := tenants["b"][0]
	pool, err := l.Router().Pool(tenant)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	in := intent(t, tenant, "k-tx", order{Item: "pen", Amount: 2})
	_, err = l.DoTx(ctx, tx, in, createOrder(tenant, order{Item: "pen", Amount: 2}), nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2, countOrders(t, sb.pools["b"], tenant))

	// A transaction on the other shard is refused before anything runs: its record would
	// land where the tenant's retries cannot see it.
	wrong, err := sb.pools["a"].Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = wrong.Rollback(ctx) }()
	in = intent(t, tenant, "k-wrong", order{Item: "pen", Amount: 2})
	_, err = l.DoTx(ctx, wrong, in, createOrder(tenant, order{Item: "pen", Amount: 2}), nil)
	var wse *shard.WrongShardError
	require.ErrorAs(t, err, &wse)
	require.Equal(t, shard.WrongShardError{Tenant: tenant, Shard: "b"}, *wse)
	_, err = l.ClaimTx(ctx, wrong, in, nil)
	require.ErrorIs(t, err, shard.ErrWrongShard)
	_, err = l.GetTx(ctx, wrong, in.Scope, in.Key)
	require.ErrorIs(t, err, shard.ErrWrongShard)
	_, err = l.CompleteTx(ctx, wrong, &ledger.Lease{Intent: in, Token: [16]byte{1}}, ledger.Response{Code: 200})
	require.ErrorIs(t, err, shard.ErrWrongShard)
	require.NoError(t, wrong.Rollback(ctx))
	require.Equal(t, 2, countOrders(t, sb.pools["b"], tenant))
	require.Zero(t, countOrders(t, sb.pools["a"], tenant))

	// Claim and its finishing calls go to the lease's shard.
	ext := intent(t, tenants["a"][1], "k-ext", order{Item: "lamp", Amount: 3})
	cr, err := l.Claim(ctx, ext, nil)
	require.NoError(t, err)
	require.NoError(t, l.Extend(ctx, cr.Lease, time.Minute))
	_, err = l.Complete(ctx, cr.Lease, ledger.Response{Code: 200})
	require.NoError(t, err)
	cr, err = l.Claim(ctx, ext, nil)
	require.NoError(t, err)
	require.Nil(t, cr.Lease)
	require.True(t, cr.Result.Replayed)

	recs, err := l.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, recs, 8)
	for i := 1; i < len(recs); i++ {
		require.False(t, recs[i].CreatedAt.After(recs[i-1].CreatedAt), "newest first across shards")
	}
	page, err := l.List(ctx, &ledger.ListOpts{Limit: 3})
	require.NoError(t, err)
	require.Equal(t, recs[:3], page)
	one, err := l.List(ctx, &ledger.ListOpts{Tenant: tenants["b"][0]})
	require.NoError(t, err)
	require.Len(t, one, 2)
	st, err := l.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(8), st.ByState[ledger.StateCompleted]["orders.create"])

	sb.clock.Advance(2 * time.Hour)
	res, err := l.Purge(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(8), res.Deleted)
	for name, pool := range sb.pools {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_records").Scan(&n))
		require.Zero(t, n, "shard %s purged", name)
	}
}

// A tenant that the picker places nowhere is refused with a typed error, and nothing
// runs.
func TestSharded_UnroutableTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	r, err := shard.New([]shard.Shard{{Name: "eu", Pool: pool}}, shard.Map(map[string]string{"acme": "eu", "globex": "us"}, nil))
	require.NoError(t, err)
	l, err := ledger.NewSharded(r, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	var calls atomic.Int32
	fn := func(context.Context, pgx.Tx) (ledger.Response, error) {
		calls.Add(1)
		return ledger.Response{Code: 200}, nil
	}
	for _, tenant := range []string{"initech", "globex"} {
		in := intent(t, tenant, "k", order{Item: "x"})
		_, err = l.Do(ctx, in, fn, nil)
		require.ErrorIs(t, err, shard.ErrUnroutable)
		var ue *shard.UnroutableError
		require.ErrorAs(t, err, &ue)
		require.Equal(t, tenant, ue.Tenant)
		_, err = l.Claim(ctx, in, nil)
		require.ErrorIs(t, err, shard.ErrUnroutable)
		_, err = l.Get(ctx, in.Scope, in.Key)
		require.ErrorIs(t, err, shard.ErrUnroutable)
		_, err = l.Complete(ctx, &ledger.Lease{Intent: in, Token: [16]byte{1}}, ledger.Response{Code: 200})
		require.ErrorIs(t, err, shard.ErrUnroutable)
		_, err = l.List(ctx, &ledger.ListOpts{Tenant: tenant})
		require.ErrorIs(t, err, shard.ErrUnroutable)
	}
	require.Zero(t, calls.Load())
	_, err = l.Do(ctx, intent(t, "acme", "k", order{Item: "x"}), fn, nil)
	require.NoError(t, err)
	require.Equal(t, int32(1), calls.Load())
}

// Many goroutines race duplicates of the same keys over tenants of both shards: each
// key's effect commits once, on its tenant's shard, one call answers it first and every
// other replays that answer. (fn may run in a transaction that then rolls back and
// replays, so its calls are not what is counted.)
func TestSharded_ConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, sb := setupSharded(t, nil)
	tenants := append(sb.tenantsOn(t, "a", 4), sb.tenantsOn(t, "b", 4)...)
	const keysPer, dups = 5, 6
	var mu sync.Mutex
	results := map[string][]ledger.Result{} // tenant/key -> every call's result
	var wg sync.WaitGroup
	for _, tenant := range tenants {
		for k := range keysPer {
			for range dups {
				wg.Go(func() {
					key := fmt.Sprintf("k-%d", k)
					in := intent(t, tenant, key, order{Item: key, Amount: 1})
					res, err := l.Do(ctx, in, createOrder(tenant, order{Item: key, Amount: 1}), &ledger.DoOpts{Wait: 10 * time.Second})
					if err != nil {
						t.Errorf("Do %s/%s: %v", tenant, key, err)
						return
					}
					mu.Lock()
					results[tenant+"/"+key] = append(results[tenant+"/"+key], res)
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
	for _, tenant := range tenants {
		s, err := sb.router.For(tenant)
		require.NoError(t, err)
		require.Equal(t, keysPer, countOrders(t, sb.pools[s.Name], tenant), "orders of %s on its shard", tenant)
		for k := range keysPer {
			id := fmt.Sprintf("%s/k-%d", tenant, k)
			firsts := 0
			for _, r := range results[id] {
				if !r.Replayed {
					firsts++
				}
				require.Equal(t, results[id][0].Response.Body, r.Response.Body, "%s: every call answers the same", id)
			}
			require.Equal(t, 1, firsts, "%s: one call ran it, the others replayed", id)
			var ref string
			require.NoError(t, sb.pools[s.Name].QueryRow(ctx, `SELECT 'order/' || id FROM orders WHERE tenant = $1 AND item = $2`,
				tenant, fmt.Sprintf("k-%d", k)).Scan(&ref))
			require.Equal(t, ref, results[id][0].Response.ResourceRef, "%s: the answer names the committed order", id)
		}
	}
}

// A shard that is down fails its own tenants' calls and no other's; once it is back,
// its tenants' retries replay what committed before the crash.
func TestSharded_OneShardDownTheOtherGoesOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, sb := setupSharded(t, &ledger.Config{Retention: time.Hour})
	onA, onB := sb.tenantsOn(t, "a", 1)[0], sb.tenantsOn(t, "b", 1)[0]
	var runs atomic.Int32
	do := func(tenant, key string) (ledger.Result, error) {
		return l.Do(ctx, intent(t, tenant, key, order{Item: key}), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			res, err := createOrder(tenant, order{Item: key})(ctx, tx)
			runs.Add(1)
			return res, err
		}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst}) // fn is called only when the key is free
	}
	_, err := do(onB, "before")
	require.NoError(t, err)

	require.NoError(t, sb.b.Stop())
	for i := range 5 {
		_, err := do(onA, fmt.Sprintf("during-%d", i))
		require.NoError(t, err, "shard a goes on while b is down")
	}
	_, err = do(onB, "during")
	require.Error(t, err, "shard b is down")
	var named *shard.Error
	require.ErrorAs(t, err, &named, "a dead shard's error names it")
	require.Equal(t, "b", named.Shard)
	_, err = l.Claim(ctx, intent(t, onB, "claim-during", order{Item: "x"}), nil)
	require.ErrorAs(t, err, &named)
	require.Equal(t, "b", named.Shard)
	_, err = l.Stats(ctx)
	require.ErrorContains(t, err, `shard "b"`)
	recs, err := l.List(ctx, nil)
	require.ErrorAs(t, err, &named, "List names the shard that failed")
	require.Equal(t, "b", named.Shard)
	require.Len(t, recs, 5, "List returns the live shard's records beside the error")
	sb.clock.Advance(2 * time.Hour)
	res, err := l.Purge(ctx, nil)
	require.ErrorContains(t, err, `shard "b"`)
	require.Equal(t, int64(5), res.Deleted, "shard a purged though b failed")

	require.NoError(t, sb.b.Start(ctx))
	sb.clock.Advance(-2 * time.Hour)
	before := runs.Load()
	require.Eventually(t, func() bool {
		res, err := do(onB, "before")
		return err == nil && res.Replayed
	}, 20*time.Second, 100*time.Millisecond, "the record committed before the crash replays")
	require.Equal(t, before, runs.Load(), "no fn ran again for the replayed key")
	require.Equal(t, 1, countOrders(t, sb.pools["b"], onB))
}

// Pages of List over both shards, with many records created in the same instant so
// that the order rests on tenant, operation and key: paging with After lists every
// record once, newest first.
func TestSharded_ListPagesSkipAndRepeatNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, sb := setupSharded(t, nil)
	tenants := append(sb.tenantsOn(t, "a", 3), sb.tenantsOn(t, "b", 3)...)
	want := map[string]bool{}
	for i := range 4 {
		for _, tenant := range tenants {
			key := fmt.Sprintf("k-%d", i)
			_, err := l.Do(ctx, intent(t, tenant, key, order{Item: key}), createOrder(tenant, order{Item: key}), nil)
			require.NoError(t, err)
			want[tenant+"/"+key] = true
		}
		if i%2 == 1 {
			sb.clock.Advance(time.Second)
		}
	}
	for _, limit := range []int{1, 2, 5} {
		seen := map[string]int{}
		var prev *ledger.Record
		opts := &ledger.ListOpts{Limit: limit}
		for {
			page, err := l.List(ctx, opts)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for i := range page {
				r := page[i]
				seen[r.Scope.Tenant+"/"+string(r.Key)]++
				if prev != nil {
					require.False(t, r.CreatedAt.After(prev.CreatedAt), "limit %d: newest first", limit)
				}
				prev = &page[i]
			}
			opts.After = &page[len(page)-1]
		}
		require.Len(t, seen, len(want), "limit %d: every record listed", limit)
		for id, n := range seen {
			require.True(t, want[id], "limit %d: %s", limit, id)
			require.Equal(t, 1, n, "limit %d: %s listed once", limit, id)
		}
	}
}

// ListAudit reads every shard's audit rows and merges them newest first; with a tenant
// it reads the tenant's shard.
func TestSharded_ListAuditMergesShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, sb := setupSharded(t, nil)
	onA, onB := sb.tenantsOn(t, "a", 1)[0], sb.tenantsOn(t, "b", 1)[0]
	var ids []int64
	for _, tenant := range []string{onA, onB, onA} {
		in := intent(t, tenant, fmt.Sprintf("k-%d", len(ids)), order{Item: "book", Amount: 1})
		_, err := l.Do(ctx, in, createOrder(tenant, order{Item: "book", Amount: 1}), nil)
		require.NoError(t, err)
		e, err := l.Change(ctx, ledger.ActionEvict, in.Scope, in.Key, &ledger.ChangeOpts{Actor: "alice", Reason: "INC-1"})
		require.NoError(t, err)
		ids = append(ids, e.ID)
	}
	entries, err := l.ListAudit(ctx, nil)
	require.NoError(t, err)
	require.Len(t, entries, 3)
	require.Equal(t, []string{onA, onB, onA}, []string{entries[2].Scope.Tenant, entries[1].Scope.Tenant, entries[0].Scope.Tenant}, "newest first across shards")
	entries, err = l.ListAudit(ctx, &ledger.AuditOpts{Limit: 2})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, onA, entries[0].Scope.Tenant)
	entries, err = l.ListAudit(ctx, &ledger.AuditOpts{Tenant: onB})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, ids[1], entries[0].ID)
}

package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/shard"
)

// shardedBundle is an outbox and an inbox on two shards: "a" holds tenant acme, on the
// test server, and "b" holds globex, on a cluster of its own.
type shardedBundle struct {
	router *shard.Router
	pools  map[string]*pgxpool.Pool
	b      *pgtest.Cluster
	schema string
	out    *outbox.Outbox
	in     *inbox.Inbox
}

var shardOf = map[string]string{"acme": "a", "globex": "b"}

func setupSharded(t *testing.T) *shardedBundle {
	t.Helper()
	ctx := context.Background()
	s := pgtest.NewSharded(t, nil, transfersDDL)
	r, err := shard.New([]shard.Shard{{Name: "a", Pool: s.A}, {Name: "b", Pool: s.B}}, shard.Map(shardOf, nil))
	require.NoError(t, err)
	applied, err := migrate.UpShards(ctx, r, s.Schema)
	require.NoError(t, err)
	require.NotEmpty(t, applied["a"].Applied)
	require.NotEmpty(t, applied["b"].Applied)
	out, err := outbox.NewSharded(r, &outbox.Config{Schema: s.Schema})
	require.NoError(t, err)
	in, err := inbox.NewSharded(r, &inbox.Config{Schema: s.Schema})
	require.NoError(t, err)
	return &shardedBundle{router: r, pools: s.Pools, b: s.Cluster, schema: s.Schema, out: out, in: in}
}

// produce commits a tenant's transfer and its event on the tenant's shard.
func (sb *shardedBundle) produce(t testing.TB, tenant string, amount int64) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	pool, err := sb.router.Pool(tenant)
	require.NoError(t, err)
	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transfers (account, amount) VALUES ($1, $2)`, tenant, amount); err != nil {
			return err
		}
		payload, _ := json.Marshal(transfer{Account: tenant, Amount: amount})
		ids, err := sb.out.Enqueue(ctx, tx, outbox.Event{Topic: "transfers", OrderingKey: tenant, Payload: payload})
		if err == nil {
			id = ids[0]
		}
		return err
	}))
	return id
}

// consume books the statement line through the inbox, on the shard of the event's
// tenant, which the context carries.
func (sb *shardedBundle) consume(ctx context.Context, e outbox.Event) error {
	var tr transfer
	if err := json.Unmarshal(e.Payload, &tr); err != nil {
		return err
	}
	_, err := sb.in.Handle(keys.WithTenant(ctx, tr.Account), "statements", e.ID.String(), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO statements (event_id, account, amount) VALUES ($1, $2, $3)`, e.ID, tr.Account, tr.Amount)
		return err
	})
	return err
}

func (sb *shardedBundle) dispatcher(t *testing.T, name string, pub outbox.Publisher, cfg *outbox.DispatcherConfig) *outbox.Dispatcher {
	t.Helper()
	so, err := sb.out.Shard(name)
	require.NoError(t, err)
	d, err := outbox.NewDispatcher(so, pub, cfg)
	require.NoError(t, err)
	return d
}

func (sb *shardedBundle) count(t *testing.T, name, table, tenant string) int {
	t.Helper()
	var n int
	require.NoError(t, sb.pools[name].QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE account = $1`, tenant).Scan(&n))
	return n
}

// Events commit on their tenant's shard and a dispatcher per shard publishes each once;
// the consumer's inbox records each on the tenant's shard; the calls over many events
// see every shard.
func TestSharded_DispatcherPerShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sb := setupSharded(t)
	_, err := outbox.NewDispatcher(sb.out, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }), nil)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig, "a dispatcher runs on one shard")
	_, err = sb.out.Shard("c")
	require.Error(t, err)

	var ids []uuid.UUID
	for i := range 3 {
		ids = append(ids, sb.produce(t, "acme", int64(i+1)), sb.produce(t, "globex", int64(i+1)))
	}
	var mu sync.Mutex
	published := map[uuid.UUID]int{}
	pub := outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		mu.Lock()
		published[e.ID]++
		mu.Unlock()
		return sb.consume(ctx, e)
	})
	for _, name := range []string{"a", "b"} {
		n, err := sb.dispatcher(t, name, pub, nil).Drain(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, n, "shard %s's dispatcher publishes its own events", name)
	}
	require.Len(t, published, 6)
	for id, n := range published {
		require.Equal(t, 1, n, "event %s published once", id)
	}
	for tenant, name := range shardOf {
		require.Equal(t, 3, sb.count(t, name, "statements", tenant))
		other := map[string]string{"a": "b", "b": "a"}[name]
		require.Zero(t, sb.count(t, other, "statements", tenant), "nothing of %s on shard %s", tenant, other)
	}
	// A redelivery is a duplicate on the tenant's shard.
	e, err := sb.out.Get(ctx, ids[1])
	require.NoError(t, err)
	require.Equal(t, outbox.StatePublished, e.State)
	require.NoError(t, sb.consume(ctx, outbox.Event{ID: e.ID, Payload: e.Payload}))
	require.Equal(t, 3, sb.count(t, "b", "statements", "globex"))
	_, err = sb.out.Get(ctx, uuid.New())
	require.ErrorIs(t, err, outbox.ErrEventNotFound)

	st, err := sb.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Published: 6}, st)
	is, err := sb.in.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, is, 1)
	require.Equal(t, int64(6), is[0].Processed)
	_, err = sb.in.Handle(ctx, "statements", "no-tenant", func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, inbox.ErrNoTenant)
	wrong, err := sb.pools["a"].Begin(ctx)
	require.NoError(t, err)
	_, err = sb.in.HandleTx(keys.WithTenant(ctx, "globex"), wrong, "statements", "wrong-shard", func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, shard.ErrWrongShard)
	require.NoError(t, wrong.Rollback(ctx))

	purger, err := outbox.NewSharded(sb.router, &outbox.Config{Schema: sb.schema, PublishedRetention: time.Nanosecond})
	require.NoError(t, err)
	n, err := purger.Purgeable(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	res, err := purger.Purge(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(6), res.Deleted)
}

// Dead events of both shards are listed oldest first, and retried by ID only when every
// ID is dead on some shard.
func TestSharded_DeadEventsAcrossShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sb := setupSharded(t)
	failing := outbox.PublisherFunc(func(context.Context, outbox.Event) error { return errors.New("broker refuses") })
	first := sb.produce(t, "acme", 1)
	second := sb.produce(t, "globex", 2)
	for _, name := range []string{"a", "b"} {
		_, err := sb.dispatcher(t, name, failing, &outbox.DispatcherConfig{MaxAttempts: 1}).Drain(ctx)
		require.NoError(t, err)
	}
	dead, err := sb.out.ListDead(ctx, nil)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, []uuid.UUID{first, second}, []uuid.UUID{dead[0].ID, dead[1].ID}, "oldest first")
	one, err := sb.out.Dead(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, first, one[0].ID)

	absent := uuid.New()
	_, err = sb.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{first, second, absent}})
	require.ErrorIs(t, err, outbox.ErrNotDead)
	var nd *outbox.NotDeadError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, []uuid.UUID{absent}, nd.Missing, "no shard has it")
	require.Equal(t, 1, nd.MissingCount)
	st, err := sb.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Dead: 2}, st, "nothing retried when one ID is dead nowhere")

	retried, err := sb.out.RetryDead(ctx, &outbox.RetryDeadOpts{IDs: []uuid.UUID{second, first}, Actor: "alice", Reason: "INC-1"})
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{first, second}, retried)
	audit, err := sb.out.ListAudit(ctx, nil)
	require.NoError(t, err)
	require.Len(t, audit, 2, "each shard keeps the rows of its own events; ListAudit reads them all")
	require.ElementsMatch(t, []uuid.UUID{first, second}, []uuid.UUID{audit[0].EventID, audit[1].EventID})
	st, err = sb.out.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{Pending: 2}, st)
}

// A shard that is down holds back its own events only.
func TestSharded_OneShardDownTheOtherPublishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sb := setupSharded(t)
	var mu sync.Mutex
	var got []string
	pub := outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, e.OrderingKey)
		return nil
	})
	da, db := sb.dispatcher(t, "a", pub, nil), sb.dispatcher(t, "b", pub, nil)
	sb.produce(t, "globex", 1)
	require.NoError(t, sb.b.Stop())
	sb.produce(t, "acme", 1)
	n, err := da.Drain(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = db.Drain(ctx)
	require.Error(t, err, "shard b is down")
	_, err = sb.out.Stats(ctx)
	require.ErrorContains(t, err, `shard "b"`)
	require.NoError(t, sb.b.Start(ctx))
	require.Eventually(t, func() bool { n, err := db.Drain(ctx); return err == nil && n == 1 }, 20*time.Second, 100*time.Millisecond)
	require.ElementsMatch(t, []string{"acme", "globex"}, got)
}

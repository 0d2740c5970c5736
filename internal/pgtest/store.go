package pgtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateFunc applies a store's migrations to schema through pool.
type MigrateFunc func(ctx context.Context, pool *pgxpool.Pool, schema string) error

// Migrator is up, a migration call such as ledger.Migrate or migrate.Up, as a
// [MigrateFunc]: its result is dropped, and the pool is handed to it as the database
// type it takes, an interface a pool satisfies.
func Migrator[DB, R any](up func(ctx context.Context, db DB, schema string) (R, error)) MigrateFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		_, err := up(ctx, any(pool).(DB), schema)
		return err
	}
}

// NewStore is [NewSchema] made ready for a store's tests: up applies the store's
// migrations (nil: none) and ddl, when not empty, creates the test's business tables.
func NewStore(tb testing.TB, up MigrateFunc, ddl string) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := NewSchema(tb)
	prepare(tb, pool, schema, up, ddl)
	return pool, schema
}

func prepare(tb testing.TB, pool *pgxpool.Pool, schema string, up MigrateFunc, ddl string) {
	tb.Helper()
	ctx := context.Background()
	if up != nil {
		if err := up(ctx, pool, schema); err != nil {
			tb.Fatalf("pgtest: migrate %s: %v", schema, err)
		}
	}
	if ddl != "" {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			tb.Fatalf("pgtest: create the test's tables in %s: %v", schema, err)
		}
	}
}

// Sharded is a store's schema on two independent clusters, for tests of a router over
// shards: shard "a" on the test server, shard "b" on a cluster of its own that a test
// may crash.
type Sharded struct {
	Schema string
	// A and B are pools on the shards' schema.
	A, B *pgxpool.Pool
	// Pools holds A and B by shard name.
	Pools map[string]*pgxpool.Pool
	// Cluster is shard b's cluster.
	Cluster *Cluster
}

// NewSharded is [NewStore] on the two shards of a [Sharded]. It skips the test on
// Citus, whose run covers one cluster.
func NewSharded(tb testing.TB, up MigrateFunc, ddl string) *Sharded {
	tb.Helper()
	if IsCitus() {
		tb.Skip("shards are independent PostgreSQL clusters; the Citus run covers one cluster")
	}
	pools, schema, clusters := Shards(tb, 2)
	for _, p := range pools {
		prepare(tb, p, schema, up, ddl)
	}
	return &Sharded{Schema: schema, A: pools[0], B: pools[1],
		Pools: map[string]*pgxpool.Pool{"a": pools[0], "b": pools[1]}, Cluster: clusters[0]}
}

// Clock is a stubbed clock for tests of expiry and leases: it starts at the database's
// time, so that what the database and the code under test compare agrees, and moves
// only when the test advances it. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a [Clock] set to the time of the database q runs on.
func NewClock(tb testing.TB, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) *Clock {
	tb.Helper()
	c := &Clock{}
	if err := q.QueryRow(context.Background(), "SELECT now()").Scan(&c.now); err != nil {
		tb.Fatalf("pgtest: read the database's time: %v", err)
	}
	return c
}

// ClockAt returns a [Clock] set to at, for a test that needs no database's time.
func ClockAt(at time.Time) *Clock { return &Clock{now: at} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

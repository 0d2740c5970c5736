package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	cluster *Cluster // nil when DATABASE_URL is used; the coordinator on Citus
	citus   *Citus   // the Citus cluster under CitusEnv
	baseURL string
)

// CitusEnv names the environment variable that runs a package's tests on a throwaway
// Citus cluster (a coordinator and two workers) instead of a single PostgreSQL, when
// set to 1. Without a Citus source tarball ([CitusTarball]) the tests are skipped with
// a note that says how to get one.
const CitusEnv = "ONCEKIT_CITUS"

// IsCitus reports whether the tests run on the Citus cluster of [CitusEnv].
func IsCitus() bool { return citus != nil }

// CitusCluster returns the Citus cluster, or skips the test when the tests do not run
// on one.
func CitusCluster(tb testing.TB) *Citus {
	tb.Helper()
	if citus == nil {
		tb.Skip("pgtest: this test needs the Citus cluster; run it with " + CitusEnv + "=1 (make test-citus)")
	}
	return citus
}

// Main runs the tests of a package against a real PostgreSQL: the server named by
// DATABASE_URL when it is set, otherwise a throwaway cluster that lives as long as the
// test binary, of the major version ONCEKIT_PG_VERSION names (see [Releases]) or from the
// machine's own binaries when it is unset. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		baseURL = url
		return runTests(m)
	}
	if os.Getenv(CitusEnv) == "1" {
		return runCitus(m)
	}
	// A chosen release is fetched first, on its own clock: the first download may take
	// minutes on a slow network.
	fetchCtx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	_, _, err := serverBinDir(fetchCtx, 0)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := StartCluster(ctx, &ClusterOpts{Settings: map[string]string{"synchronous_standby_names": heldStandby}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	cluster, baseURL = c, c.ConnString()
	// Runnable examples read DATABASE_URL, as user code does.
	os.Setenv("DATABASE_URL", baseURL)
	return runTests(m)
}

// runTests runs the tests, then closes what they kept open on the test server.
func runTests(m *testing.M) int {
	code := m.Run()
	closeAdmin()
	return code
}

func runCitus(m *testing.M) int {
	// A first build takes about two minutes; later starts take seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	c, err := StartCitus(ctx, nil)
	cancel()
	if errors.Is(err, ErrNoCitus) {
		fmt.Fprintln(os.Stderr, "skipping the tests on Citus:", err)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	citus, cluster, baseURL = c, c.Coordinator, c.ConnString()
	os.Setenv("DATABASE_URL", baseURL)
	return runTests(m)
}

// URL returns the connection string of the test server. It fails the test when Main did
// not run.
func URL(tb testing.TB) string {
	tb.Helper()
	if baseURL == "" {
		tb.Fatal("pgtest: call pgtest.Main from TestMain")
	}
	return baseURL
}

// OwnCluster returns the throwaway cluster, or skips the test when the tests run against
// DATABASE_URL (whose server the tests may not restart).
func OwnCluster(tb testing.TB) *Cluster {
	tb.Helper()
	if cluster == nil {
		tb.Skip("pgtest: this test restarts PostgreSQL and needs its own cluster; unset DATABASE_URL to run it")
	}
	return cluster
}

// NewSchema creates a fresh, empty schema for one test and returns its name and a pool
// whose connections have search_path set to it. The pool is closed and the schema dropped
// at cleanup.
func NewSchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	return NewSchemaOn(tb, URL(tb))
}

// NewSchemaOn is [NewSchema] on the server at url, such as an [ExtraCluster].
func NewSchemaOn(tb testing.TB, url string) (*pgxpool.Pool, string) {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if err := adminExec(ctx, url, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	// The pool's Close is this cleanup's, not PoolOn's: the schema is dropped only once
	// every connection on it has come back.
	pool := newPool(tb, url, schema, nil)
	tb.Cleanup(func() {
		if !closePool(tb, pool) {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := adminExec(ctx, url, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Logf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return pool, schema
}

// admin is the pool adminExec keeps on the test server.
var admin struct {
	sync.Mutex
	pool *pgxpool.Pool
}

// adminExec runs sql, which must be safe to run twice, on the server at url: on the
// test server through a small pool kept for the test binary's life (every test makes
// and drops a schema, and each new connection costs the server a process of its own,
// tens of milliseconds of CPU on a small virtual machine), elsewhere on a connection of
// its own. A statement whose connection broke, or that found the server restarting (a
// test crashed it), is sent again, for up to about five seconds.
func adminExec(ctx context.Context, url, sql string) error {
	var err error
	for attempt := range 10 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err = adminExecOnce(ctx, url, sql); err == nil || !retryable(err) {
			return err
		}
	}
	return err
}

func adminExecOnce(ctx context.Context, url, sql string) error {
	if url != baseURL {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	admin.Lock()
	if admin.pool == nil {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			admin.Unlock()
			return err
		}
		cfg.MaxConns = 4
		if admin.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			admin.Unlock()
			return err
		}
	}
	pool := admin.pool
	admin.Unlock()
	_, err := pool.Exec(ctx, sql)
	return err
}

// retryable reports whether err is the connection's or the server's going away rather
// than the statement's own failure.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now.
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// closeAdmin closes adminExec's pool, before the test server stops.
func closeAdmin() {
	admin.Lock()
	defer admin.Unlock()
	if admin.pool != nil {
		admin.pool.Close()
		admin.pool = nil
	}
}

// ExtraCluster starts a throwaway cluster of its own for one test, beside the test
// server, of the same PostgreSQL major (ONCEKIT_PG_VERSION, or the machine's); it is
// removed at cleanup. Tests of shards take one as their second shard, and may crash it:
// it is durable, so a crash loses no commit it acknowledged.
func ExtraCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := StartCluster(context.Background(), &ClusterOpts{Durable: true})
	if err != nil {
		tb.Fatalf("pgtest: start a cluster: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Pool opens a pool on the test server with search_path set to schema. configure, when
// not nil, may change the configuration before the pool is made. The pool is closed at
// cleanup.
func Pool(tb testing.TB, schema string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	return PoolOn(tb, URL(tb), schema, configure)
}

// PoolOn is [Pool] on the server at url, such as an [ExtraCluster]'s.
func PoolOn(tb testing.TB, url, schema string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	pool := newPool(tb, url, schema, configure)
	tb.Cleanup(func() { closePool(tb, pool) })
	return pool
}

// newPool is [PoolOn] without the cleanup that closes the pool.
func newPool(tb testing.TB, url, schema string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pgtest: parse URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: pool: %v", err)
	}
	return pool
}

// closePool closes pool at a test's cleanup, and reports whether it closed. Close waits
// for every connection the test acquired to come back, which a test that stopped at a
// failed assertion while it held one (a transaction it began) never returns: after ten
// seconds the test fails saying so, instead of waiting until the binary's timeout.
func closePool(tb testing.TB, pool *pgxpool.Pool) bool {
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
		return true
	case <-time.After(10 * time.Second):
		tb.Errorf("pgtest: the test's pool did not close within 10 s: a connection the test acquired (a transaction it began) was never released")
		return false
	}
}

// ExecModes is every way pgx can send a statement. Failure paths behave differently in
// each: some prepare or describe a batch's statements before running any of them, which
// PostgreSQL refuses inside an aborted transaction.
var ExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// EachExecMode runs test in a parallel subtest per [ExecModes] entry, each with a pool of
// its own on schema: fresh connections in that mode, with nothing prepared or cached.
func EachExecMode(t *testing.T, schema string, test func(t *testing.T, pool *pgxpool.Pool)) {
	t.Helper()
	for _, mode := range ExecModes {
		t.Run(execModeName(mode), func(t *testing.T) {
			t.Parallel()
			test(t, Pool(t, schema, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode }))
		})
	}
}

func execModeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeCacheStatement:
		return "CacheStatement"
	case pgx.QueryExecModeCacheDescribe:
		return "CacheDescribe"
	case pgx.QueryExecModeDescribeExec:
		return "DescribeExec"
	case pgx.QueryExecModeExec:
		return "Exec"
	default:
		return "SimpleProtocol"
	}
}

// Shards makes a schema of one name on the test server and on n-1 [ExtraCluster]s, for
// tests of a router over independent clusters, and returns a pool on each (the test
// server's first) and the clusters started.
func Shards(tb testing.TB, n int) ([]*pgxpool.Pool, string, []*Cluster) {
	tb.Helper()
	first, schema := NewSchema(tb)
	pools := []*pgxpool.Pool{first}
	var clusters []*Cluster
	for range n - 1 {
		c := ExtraCluster(tb)
		admin, err := pgx.Connect(context.Background(), c.ConnString())
		if err != nil {
			tb.Fatalf("pgtest: connect: %v", err)
		}
		_, err = admin.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
		admin.Close(context.Background())
		if err != nil {
			tb.Fatalf("pgtest: create schema: %v", err)
		}
		pools = append(pools, PoolOn(tb, c.ConnString(), schema, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		}))
		clusters = append(clusters, c)
	}
	return pools, schema, clusters
}

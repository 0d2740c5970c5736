package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

const benchSchema = "oncekit_bench"

type ledgerBench struct {
	url         string
	rounds      int
	opsPerRound int // per client
}

// env is one pool and ledger, with a round-trip counter on its connections.
type env struct {
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	trips  *tripCounter
	fp     keys.Fingerprint
	scope  keys.Scope
	replay []keys.Key
}

func (b ledgerBench) newEnv(ctx context.Context, conns int32, params map[string]string) (*env, error) {
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = conns, conns
	cfg.ConnConfig.RuntimeParams["search_path"] = benchSchema
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	tc := &tripCounter{}
	dialer := &net.Dialer{KeepAlive: 5 * time.Minute}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, tc: tc}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	l, err := ledger.New(pool, &ledger.Config{Schema: benchSchema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	fp, _ := keys.FingerprintJSON(map[string]any{"item": "bench", "amount": 100})
	return &env{pool: pool, ledger: l, trips: tc, fp: fp, scope: keys.Scope{Tenant: "bench", Operation: "orders.create"}}, nil
}

var scenarioNames = []string{"bare", "floor", "first", "first_lookup", "replay", "naive"}

const insertOrder = `INSERT INTO orders (item, amount) VALUES ('bench', 100)`

func (e *env) mutation(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
	if _, err := tx.Exec(ctx, insertOrder); err != nil {
		return ledger.Response{}, err
	}
	return ledger.Response{Code: 201, Body: []byte(`{"status":"created"}`)}, nil
}

func (e *env) intent(k keys.Key) ledger.Intent {
	return ledger.Intent{Scope: e.scope, Key: k, Fingerprint: e.fp}
}

func (e *env) scenarios() []scenario {
	return []scenario{
		{"bare", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertOrder)
				return err
			})
		}},
		// The physical floor of any ledger: the bare transaction plus one row of the same
		// shape as a ledger record, with no dedup logic at all.
		{"floor", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insertOrder); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO floor_records (tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at)
					VALUES ('bench', 'orders.create', $1, $2, 'completed', 201, $3, 1, now(), now(), now() + interval '30 days')`,
					uuid.NewString(), string(e.fp), []byte(`{"status":"created"}`))
				return err
			})
		}},
		{"first", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, &ledger.DoOpts{FirstAttempt: true})
			return err
		}},
		{"first_lookup", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, nil)
			return err
		}},
		{"replay", func(ctx context.Context, i int) error {
			res, err := e.ledger.Do(ctx, e.intent(e.replay[i%len(e.replay)]), e.mutation, nil)
			if err == nil && !res.Replayed {
				err = fmt.Errorf("replay scenario ran the mutation")
			}
			return err
		}},
		{"naive", func(ctx context.Context, _ int) error { return e.naive(ctx, uuid.NewString()) }},
	}
}

// naive is the guard many codebases write first: look, begin, insert, lock, mutate,
// update, commit; six statements and as many round trips.
func (e *env) naive(ctx context.Context, key string) error {
	var exists bool
	if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM naive_keys WHERE key = $1)`, key).Scan(&exists); err != nil || exists {
		return err
	}
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO naive_keys (key, state) VALUES ($1, 'pending') ON CONFLICT DO NOTHING`, key); err != nil {
			return err
		}
		var state string
		if err := tx.QueryRow(ctx, `SELECT state FROM naive_keys WHERE key = $1 FOR UPDATE`, key).Scan(&state); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertOrder); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE naive_keys SET state = 'done', body = $2 WHERE key = $1`, key, []byte(`{"status":"created"}`))
		return err
	})
}

func (b ledgerBench) setupSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+benchSchema+" CASCADE"); err != nil {
		return err
	}
	if _, err := ledger.Migrate(ctx, conn, benchSchema); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SET search_path TO `+benchSchema+`;
		CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL, amount bigint NOT NULL);
		CREATE TABLE naive_keys (key text PRIMARY KEY, state text NOT NULL, body bytea);
		CREATE TABLE floor_records (LIKE idempotency_records INCLUDING ALL)`)
	return err
}

func (b ledgerBench) run(ctx context.Context, out io.Writer) error {
	if err := b.setupSchema(ctx); err != nil {
		return err
	}
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }

	type variant struct {
		suffix  string
		clients int
		params  map[string]string
	}
	variants := []variant{
		{"c1", 1, nil},
		{"c8", 8, nil},
		// Commit without waiting for the WAL flush: round trips dominate, so this shows
		// the guard's own overhead without the disk's cost hiding it.
		{"c1.async", 1, map[string]string{"synchronous_commit": "off"}},
	}
	for _, v := range variants {
		e, err := b.newEnv(ctx, int32(v.clients), v.params)
		if err != nil {
			return err
		}
		if err := e.seedReplays(ctx, 200); err != nil {
			e.pool.Close()
			return err
		}
		lat, err := interleave(ctx, b.rounds, b.opsPerRound, v.clients, e.scenarios())
		e.pool.Close()
		if err != nil {
			return err
		}
		for _, name := range scenarioNames {
			emit(fmt.Sprintf("ledger.%s_us.%s", name, v.suffix), lat[name])
		}
		emit("ledger.first_vs_bare."+v.suffix, lat["first"]/lat["bare"])
		emit("ledger.floor_vs_bare."+v.suffix, lat["floor"]/lat["bare"])
		emit("ledger.first_vs_floor."+v.suffix, lat["first"]/lat["floor"])
		emit("ledger.first_lookup_vs_bare."+v.suffix, lat["first_lookup"]/lat["bare"])
		emit("ledger.naive_vs_bare."+v.suffix, lat["naive"]/lat["bare"])
		emit("ledger.replay_vs_first."+v.suffix, lat["replay"]/lat["first"])
	}
	return b.measureCosts(ctx, emit)
}

// seedReplays completes n keys for the replay scenario.
func (e *env) seedReplays(ctx context.Context, n int) error {
	e.replay = make([]keys.Key, n)
	for i := range e.replay {
		e.replay[i] = keys.Key(uuid.NewString())
		if _, err := e.ledger.Do(ctx, e.intent(e.replay[i]), e.mutation, nil); err != nil {
			return err
		}
	}
	return nil
}

// measureCosts counts network round trips and WAL activity per operation on a single
// connection.
func (b ledgerBench) measureCosts(ctx context.Context, emit func(string, float64)) error {
	e, err := b.newEnv(ctx, 1, nil)
	if err != nil {
		return err
	}
	defer e.pool.Close()
	if err := e.seedReplays(ctx, 20); err != nil {
		return err
	}
	const n = 20
	byName := map[string]scenario{}
	for _, s := range e.scenarios() {
		byName[s.name] = s
	}
	for _, name := range scenarioNames {
		s := byName[name]
		// Warm the statement cache, and (for replays) visit every record once so that
		// page pruning after the seeding is not counted.
		for i := range len(e.replay) {
			if err := s.op(ctx, i); err != nil {
				return err
			}
		}
		walBefore, err := e.walStats(ctx)
		if err != nil {
			return err
		}
		e.trips.reset()
		for i := range n {
			if err := s.op(ctx, i); err != nil {
				return err
			}
		}
		trips := e.trips.load()
		walAfter, err := e.walStats(ctx)
		if err != nil {
			return err
		}
		emit("ledger.roundtrips."+name, float64(trips)/n)
		emit("ledger.wal_flushes."+name, float64(walAfter.syncs-walBefore.syncs)/n)
		emit("ledger.wal_records."+name, float64(walAfter.records-walBefore.records)/n)
	}
	return nil
}

type walStats struct{ records, syncs int64 }

// walStats reads pg_stat_wal after making this connection's pending statistics visible.
// The counting connection is used for the work; statistics are read on a fresh one so
// that the reading itself is not counted as work.
func (e *env) walStats(ctx context.Context) (walStats, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return walStats{}, err
	}
	_, err = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	conn.Release()
	if err != nil {
		return walStats{}, err
	}
	// Backends publish statistics when idle; give the flush a moment to land.
	time.Sleep(1100 * time.Millisecond)
	var s walStats
	err = e.pool.QueryRow(ctx, "SELECT pg_stat_clear_snapshot() IS NULL AND true, wal_records, wal_sync FROM pg_stat_wal").
		Scan(new(bool), &s.records, &s.syncs)
	return s, err
}

// tripCounter counts round trips: a write that follows a read starts a new one.
type tripCounter struct {
	mu    sync.Mutex
	trips int64
}

func (t *tripCounter) reset() {
	t.mu.Lock()
	t.trips = 0
	t.mu.Unlock()
}

func (t *tripCounter) load() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.trips
}

type countingConn struct {
	net.Conn
	tc      *tripCounter
	inTrip  bool
	sawRead bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.tc.mu.Lock()
	if !c.inTrip || c.sawRead {
		c.tc.trips++
		c.inTrip, c.sawRead = true, false
	}
	c.tc.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.tc.mu.Lock()
		c.sawRead = true
		c.tc.mu.Unlock()
	}
	return n, err
}

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/countmeter"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

const benchSchema = "oncekit_bench"

type ledgerBench struct {
	// server returns a server to measure on, fresh for each repetition where it can.
	server func(ctx context.Context) (url string, done func(), err error)
	reps   int
	rounds int
	burst  int // operations of one scenario in a row, per client
	// serverTime says the cluster has pg_stat_statements loaded (and tracking nothing):
	// each repetition then also splits an operation's time into the server's and the
	// client's.
	serverTime bool
}

// env is one pool and ledger, with a round-trip counter on its connections.
type env struct {
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	// metered is the same ledger with an in-memory meter and a logger: what a first
	// execution costs when its metrics are recorded.
	metered *ledger.Ledger
	trips   *pgtest.Trips
	fp      keys.Fingerprint
	scope   keys.Scope
	replay  []keys.Key
}

func newEnv(ctx context.Context, url string, conns int32, params map[string]string) (*env, error) {
	return newEnvRTT(ctx, url, conns, params, 0)
}

// newEnvRTT is newEnv on a network whose round trip is rtt longer (see delayed).
func newEnvRTT(ctx context.Context, url string, conns int32, params map[string]string, rtt time.Duration) (*env, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = conns, conns
	cfg.ConnConfig.RuntimeParams["search_path"] = benchSchema
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	tc := &pgtest.Trips{}
	cfg.ConnConfig.DialFunc = tc.Dial(delayed((&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext, rtt))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	l, err := ledger.New(pool, &ledger.Config{Schema: benchSchema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	metered, err := ledger.New(pool, &ledger.Config{Schema: benchSchema, MeterProvider: countmeter.New(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		pool.Close()
		return nil, err
	}
	fp, _ := keys.FingerprintJSON(map[string]any{"item": "bench", "amount": 100})
	return &env{pool: pool, ledger: l, metered: metered, trips: tc, fp: fp, scope: keys.Scope{Tenant: "bench", Operation: "orders.create"}}, nil
}

// The scenarios, by what they compare:
//   - bare: what users write today, pgx.BeginFunc with one INSERT (3 round trips);
//     bare_again is the same code again, so bare_again/bare shows the noise floor.
//   - bare_pipelined: the same with BEGIN sent in the INSERT's round trip (2).
//   - floor: bare plus one row of the ledger record's shape sent with COMMIT (3);
//     floor_pipelined: the same with BEGIN pipelined (2). No dedup logic at all: the
//     least any ledger can cost at those round trips.
//   - first: a guarded first execution in ModeOptimistic (no claim, 2 round trips);
//     first_default: the default mode, ModeClaimWithFirstStatement (the claim with the
//     mutation's statement, 2); first_lookup: ModeLookUpFirst, looking for a stored
//     result first, then claiming (4); first_claim: ModeClaimFirst (3); replay: a
//     completed key in ModeLookUpFirst (1); replay_default and replay_claim: the same
//     in the default mode and in ModeClaimFirst.
//   - naive: the look-then-insert guard many codebases write first.
//   - first_metered: first on a ledger whose metrics are recorded (an in-memory meter
//     summing every counter), so metered_vs_first prices the instruments.
//   - statement: Ledger.DoStatement with the same INSERT (RETURNING its id), one
//     statement that claims, writes and records, in one round trip; statement_floor: the
//     same INSERT and a record-shaped row with its rows as JSON in one statement sent
//     raw, no claim, no read of the record and no oncekit code (1 round trip);
//     replay_statement: a replay of a completed key by DoStatement (1).
var scenarioNames = []string{"bare", "bare_again", "bare_pipelined", "floor", "floor_pipelined", "first", "first_metered", "first_default", "first_lookup", "first_claim",
	"replay", "replay_default", "replay_claim", "naive", "statement", "statement_floor", "replay_statement",
	"probe_savepoint", "probe_lock", "probe_claim", "probe_protocol", "probe_lock_timeout", "floor_ledger_record", "floor_ledger_record_plain"}

// The probes price the statements a first execution could add to floor_pipelined, one
// at a time: the savepoint, the advisory try-lock, the whole claim, claim and savepoint
// (what a claimed first execution sends), and a bound on the record's wait.
var probes = map[string][]string{
	"probe_savepoint": {"SAVEPOINT oncekit_fn"},
	"probe_lock":      {"SELECT pg_try_advisory_xact_lock($1)"},
	"probe_claim":     {claimProbe},
	"probe_protocol":  {claimProbe, "SAVEPOINT oncekit_fn"},
	// The optimistic protocol's only statement beyond the floor: a bound on how long its
	// record's INSERT waits for a concurrent attempt.
	"probe_lock_timeout": {"SET LOCAL lock_timeout = 1000"},
}

const claimProbe = `SELECT 1 / CASE WHEN NOT pg_try_advisory_xact_lock($1) THEN 0
	WHEN EXISTS (SELECT 1 FROM idempotency_records WHERE tenant = 'bench' AND operation = 'orders.create' AND key = $2::text
		AND expires_at > coalesce(NULL::timestamptz, now())) THEN 0 ELSE 1 END`

const insertOrder = `INSERT INTO orders (item, amount) VALUES ('bench', 100)`

// statementOrder is insertOrder for DoStatement, whose rows are its stored response.
var statementOrder = ledger.Statement{SQL: insertOrder + ` RETURNING id`, Code: 201}

// statementFloor is statementOrder and a row of the ledger record's shape, its body the
// order's rows as DoStatement stores them, in one statement.
const statementFloor = `WITH w AS (` + insertOrder + ` RETURNING id)
	INSERT INTO floor_records (tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at)
	SELECT 'bench', 'orders.create', $1, $2, 'completed', 201,
		convert_to(coalesce('[' || string_agg(row_to_json(w.*)::text, ',') || ']', '[]'), 'UTF8'), 1, now(), now(), now() + interval '30 days'
	FROM w RETURNING body`

const insertFloorRecord = `INSERT INTO floor_records (tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at)
	VALUES ('bench', 'orders.create', $1, $2, 'completed', 201, $3, 1, now(), now(), now() + interval '30 days')`

func (e *env) mutation(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
	if _, err := tx.Exec(ctx, insertOrder); err != nil {
		return ledger.Response{}, err
	}
	return ledger.Response{Code: 201, Body: []byte(`{"status":"created"}`)}, nil
}

func (e *env) intent(k keys.Key) ledger.Intent {
	return ledger.Intent{Scope: e.scope, Key: k, Fingerprint: e.fp}
}

// bare is the business transaction as users write it.
func (e *env) bare(ctx context.Context, _ int) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insertOrder)
		return err
	})
}

// pipelined runs [BEGIN, extra statements, INSERT] in one round trip and then the end
// of the transaction: COMMIT alone, or a record with COMMIT.
func (e *env) pipelined(ctx context.Context, record *pgx.QueuedQuery, extra ...string) error {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	for _, sql := range extra {
		switch strings.Count(sql, "$") {
		case 0:
			b.Queue(sql)
		case 1:
			b.Queue(sql, rand.Int64())
		default:
			b.Queue(sql, rand.Int64(), uuid.NewString())
		}
	}
	b.Queue(insertOrder)
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return finishFloor(ctx, tx, record)
}

// floorRecord is one row shaped like a ledger record, for the floor scenarios.
func (e *env) floorRecord() *pgx.QueuedQuery {
	return &pgx.QueuedQuery{SQL: insertFloorRecord, Arguments: []any{uuid.NewString(), string(e.fp), []byte(`{"status":"created"}`)}}
}

// ledgerFloorRecord is the ledger's own record statement aimed at the floor's table:
// floor_ledger_record is floor_pipelined with it, so first against it is Do's Go code
// alone. With plain set it is the same INSERT without its conflict clause, which
// replaces an expired record (floor_ledger_record_plain).
func (e *env) ledgerFloorRecord(plain bool) *pgx.QueuedQuery {
	sql := ledgerRecord
	if plain {
		sql = ledgerRecordPlain
	}
	return &pgx.QueuedQuery{SQL: sql, Arguments: []any{"bench", "orders.create", uuid.NewString(), nil, string(e.fp), recordRetention, 201,
		[]byte(`{"status":"created"}`), nil, time.Now().Truncate(time.Microsecond), nil, nil, nil, nil}}
}

// recordRetention is the floor records' retention, as the ledger passes it.
var recordRetention = pgtype.Interval{Microseconds: (30 * 24 * time.Hour).Microseconds(), Valid: true}

// ledgerRecord is the ledger's record INSERT, read from its file
// (ledger/sql/insert_completed.sql; the bench runs from the module's root) and aimed at
// the floor's table; ledgerRecordPlain is the same without its conflict clause.
var ledgerRecord, ledgerRecordPlain = func() (string, string) {
	b, err := os.ReadFile(filepath.Join("ledger", "sql", "insert_completed.sql"))
	if err != nil {
		panic("bench: run from the module's root: " + err.Error())
	}
	sql := strings.ReplaceAll(string(b), "{{records}}", "floor_records")
	i := strings.Index(sql, "ON CONFLICT")
	if i < 0 {
		panic("bench: the ledger's record statement has no conflict clause")
	}
	return sql, sql[:i]
}()

// finishFloor commits, sending record with COMMIT when it is not nil. tx must be a
// connection's, not a pool's: a pool takes its connection back only when its
// transaction is committed through pgx.
func finishFloor(ctx context.Context, tx pgx.Tx, record *pgx.QueuedQuery) error {
	if record == nil {
		return tx.Commit(ctx)
	}
	b := &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{record}}
	b.Queue("COMMIT")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return nil
}

func (e *env) scenarios() []scenario {
	return []scenario{
		{"bare", e.bare},
		{"bare_again", e.bare},
		{"bare_pipelined", func(ctx context.Context, _ int) error { return e.pipelined(ctx, nil) }},
		{"floor", func(ctx context.Context, _ int) error {
			conn, err := e.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, insertOrder); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return finishFloor(ctx, tx, e.floorRecord())
		}},
		{"floor_pipelined", func(ctx context.Context, _ int) error { return e.pipelined(ctx, e.floorRecord()) }},
		{"first", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, &ledger.DoOpts{Mode: ledger.ModeOptimistic})
			return err
		}},
		{"first_metered", func(ctx context.Context, _ int) error {
			_, err := e.metered.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, &ledger.DoOpts{Mode: ledger.ModeOptimistic})
			return err
		}},
		{"first_default", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, nil)
			return err
		}},
		{"first_lookup", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, &ledger.DoOpts{Mode: ledger.ModeLookUpFirst})
			return err
		}},
		{"first_claim", func(ctx context.Context, _ int) error {
			_, err := e.ledger.Do(ctx, e.intent(keys.Key(uuid.NewString())), e.mutation, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
			return err
		}},
		{"statement", func(ctx context.Context, _ int) error {
			_, err := e.ledger.DoStatement(ctx, e.intent(keys.Key(uuid.NewString())), statementOrder, nil)
			return err
		}},
		{"statement_floor", func(ctx context.Context, _ int) error {
			var body []byte
			return e.pool.QueryRow(ctx, statementFloor, uuid.NewString(), string(e.fp)).Scan(&body)
		}},
		{"replay_statement", func(ctx context.Context, i int) error {
			res, err := e.ledger.DoStatement(ctx, e.intent(e.replay[i%len(e.replay)]), statementOrder, nil)
			if err == nil && !res.Replayed {
				err = fmt.Errorf("replay scenario ran the statement")
			}
			return err
		}},
		{"replay_claim", e.replayIn(ledger.ModeClaimFirst)},
		{"replay", e.replayIn(ledger.ModeLookUpFirst)},
		{"replay_default", e.replayIn(ledger.ModeClaimWithFirstStatement)},
		{"naive", func(ctx context.Context, _ int) error { return e.naive(ctx, uuid.NewString()) }},
		{"probe_savepoint", e.probe("probe_savepoint")},
		{"probe_lock", e.probe("probe_lock")},
		{"probe_claim", e.probe("probe_claim")},
		{"probe_protocol", e.probe("probe_protocol")},
		{"probe_lock_timeout", e.probe("probe_lock_timeout")},
		{"floor_ledger_record", func(ctx context.Context, _ int) error { return e.pipelined(ctx, e.ledgerFloorRecord(false)) }},
		{"floor_ledger_record_plain", func(ctx context.Context, _ int) error { return e.pipelined(ctx, e.ledgerFloorRecord(true)) }},
	}
}

// replayIn is a replay of a completed key in mode.
func (e *env) replayIn(mode ledger.Mode) func(context.Context, int) error {
	return func(ctx context.Context, i int) error {
		res, err := e.ledger.Do(ctx, e.intent(e.replay[i%len(e.replay)]), e.mutation, &ledger.DoOpts{Mode: mode})
		if err == nil && !res.Replayed {
			err = fmt.Errorf("replay scenario ran the mutation")
		}
		return err
	}
}

func (e *env) probe(name string) func(context.Context, int) error {
	return func(ctx context.Context, _ int) error { return e.pipelined(ctx, e.floorRecord(), probes[name]...) }
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

func setupSchema(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+benchSchema+" CASCADE"); err != nil {
		return err
	}
	if _, err := migrate.Up(ctx, conn, benchSchema); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SET search_path TO `+benchSchema+`;
		CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL, amount bigint NOT NULL);
		CREATE TABLE naive_keys (key text PRIMARY KEY, state text NOT NULL, body bytea);
		CREATE TABLE floor_records (LIKE idempotency_records INCLUDING ALL)`)
	return err
}

// ratios are the figures the ledger group reports per client variant: name, numerator
// and denominator scenario.
var ledgerRatios = [][3]string{
	{"noise", "bare_again", "bare"},
	{"statement_vs_bare", "statement", "bare"},
	{"statement_vs_floor", "statement", "statement_floor"},
	{"default_vs_bare", "first_default", "bare"},
	{"replay_statement_vs_statement", "replay_statement", "statement"},
	{"first_vs_bare", "first", "bare"},
	{"first_vs_floor", "first", "floor_pipelined"},
	{"first_vs_bare.metered", "first_metered", "bare"},
	{"metered_vs_first", "first_metered", "first"},
	{"first_default_vs_bare", "first_default", "bare"},
	{"first_default_vs_floor", "first_default", "floor_pipelined"},
	{"first_lookup_vs_bare", "first_lookup", "bare"},
	{"first_lookup_vs_floor", "first_lookup", "floor"},
	{"first_claim_vs_bare", "first_claim", "bare"},
	{"replay_claim_vs_first_claim", "replay_claim", "first_claim"},
	{"floor_vs_bare", "floor", "bare"},
	{"bare_pipelined_vs_bare", "bare_pipelined", "bare"},
	{"replay_vs_first", "replay", "first"},
	{"replay_default_vs_first_default", "replay_default", "first_default"},
	{"naive_vs_bare", "naive", "bare"},
	{"probe_savepoint_vs_floor", "probe_savepoint", "floor_pipelined"},
	{"probe_lock_vs_floor", "probe_lock", "floor_pipelined"},
	{"probe_claim_vs_floor", "probe_claim", "floor_pipelined"},
	{"probe_protocol_vs_floor", "probe_protocol", "floor_pipelined"},
	{"probe_lock_timeout_vs_floor", "probe_lock_timeout", "floor_pipelined"},
	{"floor_ledger_record_vs_floor", "floor_ledger_record", "floor_pipelined"},
	{"first_vs_floor_ledger_record", "first", "floor_ledger_record"},
	{"floor_ledger_record_plain_vs_floor", "floor_ledger_record_plain", "floor_pipelined"},
}

// run measures on a fresh cluster per repetition (or a fresh schema, on DATABASE_URL),
// so one cluster's luck (its checkpoints, its place on the disk) does not decide a ratio.
func (b ledgerBench) run(ctx context.Context, out io.Writer) error {
	line := func(s string) { fmt.Fprintln(out, s) }
	type variant struct {
		suffix  string
		clients int
		params  map[string]string
		rtt     time.Duration
		share   int // runs 1/share of the rounds (0: all)
	}
	variants := []variant{
		{"c1", 1, nil, 0, 0},
		{"c8", 8, nil, 0, 0},
		// Commit without waiting for the WAL flush: the guard's own cost shows without
		// the disk's hiding it.
		{"c1.async", 1, map[string]string{"synchronous_commit": "off"}, 0, 0},
		// The database 1 ms away, as in another availability zone: what round trips cost
		// where they are not free. The round trips dominate, so a quarter of the rounds
		// suffice.
		{"c1.rtt1ms", 1, nil, time.Millisecond, 4},
	}
	figures := repeated{}
	var order []string
	for rep := range b.reps {
		url, done, err := b.server(ctx)
		if err != nil {
			return err
		}
		err = func() error {
			defer done()
			if err := setupSchema(ctx, url); err != nil {
				return err
			}
			for _, v := range variants {
				e, err := newEnvRTT(ctx, url, int32(v.clients), v.params, v.rtt)
				if err != nil {
					return err
				}
				if err := e.seedReplays(ctx, 200); err != nil {
					e.pool.Close()
					return err
				}
				lat, err := interleave(ctx, max(b.rounds/max(v.share, 1), 1), b.burst, v.clients, e.scenarios())
				e.pool.Close()
				if err != nil {
					return err
				}
				for _, name := range scenarioNames {
					figures.add(fmt.Sprintf("ledger.%s_us.%s", name, v.suffix), lat[name])
				}
				for _, r := range ledgerRatios {
					figures.add(fmt.Sprintf("ledger.%s.%s", r[0], v.suffix), lat[r[1]]/lat[r[2]])
				}
			}
			if b.serverTime {
				server, client, err := splitTimes(ctx, url, b.rounds)
				if err != nil {
					return err
				}
				for _, name := range scenarioNames {
					figures.add("ledger.server_us."+name, server[name])
					figures.add("ledger.client_us."+name, client[name])
				}
			}
			if rep == 0 {
				return measureCosts(ctx, url, line)
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	for _, v := range variants {
		for _, r := range ledgerRatios {
			order = append(order, fmt.Sprintf("ledger.%s.%s", r[0], v.suffix))
		}
		for _, name := range scenarioNames {
			order = append(order, fmt.Sprintf("ledger.%s_us.%s", name, v.suffix))
		}
	}
	for _, name := range scenarioNames {
		order = append(order, "ledger.server_us."+name, "ledger.client_us."+name)
	}
	figures.emit(line, order)
	return nil
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

// measureCosts counts network round trips, WAL records and bytes, WAL flushes and
// transaction IDs per operation on a single connection.
func measureCosts(ctx context.Context, url string, line func(string)) error {
	e, err := newEnv(ctx, url, 1, nil)
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
		before, err := e.costs(ctx)
		if err != nil {
			return err
		}
		e.trips.Reset()
		for i := range n {
			if err := s.op(ctx, i); err != nil {
				return err
			}
		}
		trips := e.trips.Load()
		after, err := e.costs(ctx)
		if err != nil {
			return err
		}
		per := func(a, b int64) float64 { return float64(a-b) / n }
		line(fmt.Sprintf("metric ledger.roundtrips.%s %.3g", name, float64(trips)/n))
		if alias, ok := roundTripAliases[name]; ok {
			line(fmt.Sprintf("metric ledger.%s %.3g", alias, float64(trips)/n))
		}
		line(fmt.Sprintf("metric ledger.wal_records.%s %.3g", name, per(after.records, before.records)))
		line(fmt.Sprintf("metric ledger.wal_bytes.%s %.4g", name, per(after.bytes, before.bytes)))
		line(fmt.Sprintf("metric ledger.wal_flushes.%s %.3g", name, per(after.syncs, before.syncs)))
		line(fmt.Sprintf("metric ledger.xids.%s %.3g", name, per(after.xids, before.xids)))
	}
	return nil
}

// splitTimes splits each scenario's time per operation in two, on one connection:
// the time PostgreSQL spent planning and executing its statements, COMMIT (the WAL
// flush) aside, as pg_stat_statements records it; and the time the client itself took,
// the operation's time less the time its reads waited for the server. Scenarios run in
// bursts, in a fresh random order every round, as the latency passes run them; each
// figure is the median over the rounds of a burst's time per operation.
func splitTimes(ctx context.Context, url string, rounds int) (server, client map[string]float64, err error) {
	const burst = 10
	e, err := newEnv(ctx, url, 1, map[string]string{"pg_stat_statements.track": "top"})
	if err != nil {
		return nil, nil, err
	}
	defer e.pool.Close()
	if _, err := e.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public"); err != nil {
		return nil, nil, err
	}
	if err := e.seedReplays(ctx, 20); err != nil {
		return nil, nil, err
	}
	// The read names pg_stat, and leaves itself out.
	read := func() (ms float64, err error) {
		err = e.pool.QueryRow(ctx, `SELECT coalesce(sum(total_plan_time + total_exec_time), 0)
			FROM public.pg_stat_statements WHERE lower(query) <> 'commit' AND query NOT LIKE '%pg_stat%'`).Scan(&ms)
		return ms, err
	}
	serverSamples, clientSamples := map[string][]float64{}, map[string][]float64{}
	order := e.scenarios()
	for round := -1; round < rounds; round++ {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, s := range order {
			before, err := read()
			if err != nil {
				return nil, nil, err
			}
			e.trips.Reset()
			start := time.Now()
			for i := range burst {
				if err := s.op(ctx, i); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", s.name, err)
				}
			}
			own := time.Since(start) - e.trips.Wait()
			after, err := read()
			if err != nil {
				return nil, nil, err
			}
			if round >= 0 { // the first round warms the statement cache
				serverSamples[s.name] = append(serverSamples[s.name], (after-before)*1000/burst)
				clientSamples[s.name] = append(clientSamples[s.name], float64(own.Nanoseconds())/1e3/burst)
			}
		}
	}
	server, client = map[string]float64{}, map[string]float64{}
	for name := range serverSamples {
		server[name], client[name] = median(serverSamples[name]), median(clientSamples[name])
	}
	return server, client, nil
}

// roundTripAliases name the round trips of the replays the ledger promises a bound on.
var roundTripAliases = map[string]string{
	"replay_statement": "statement_replay_roundtrips",
	"replay_default":   "default_replay_roundtrips",
}

type costStats struct{ records, bytes, syncs, xids int64 }

// costs reads pg_stat_wal and the next transaction ID after making this connection's
// pending statistics visible. The counting connection is used for the work;
// statistics are read on a fresh one so that the reading itself is not counted.
func (e *env) costs(ctx context.Context) (costStats, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return costStats{}, err
	}
	_, err = conn.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	conn.Release()
	if err != nil {
		return costStats{}, err
	}
	// Backends publish statistics when idle; give the flush a moment to land.
	time.Sleep(1100 * time.Millisecond)
	var s costStats
	err = e.pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot() IS NULL AND true, wal_records, wal_bytes::bigint, wal_sync,
			pg_snapshot_xmax(pg_current_snapshot())::text::bigint FROM pg_stat_wal`).
		Scan(new(bool), &s.records, &s.bytes, &s.syncs, &s.xids)
	return s, err
}

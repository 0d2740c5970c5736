package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/history"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

// The history checker's stubbed durations: records expire and leases lapse while the
// clients run, since the clock moves about as fast as real time.
const (
	histRetention = time.Second
	histLease     = 300 * time.Millisecond
	histClients   = 16
	// histBurstClients start a call on a key the moment a Do's mutation of it returns,
	// so that their claims meet its commit: a claim that looked for the key's record
	// before it held the key's lock would miss a record committed in between.
	histBurstClients = 6
	histDoKeys       = 24
	histExtKeys      = 5 // the first histLongKeys take long leases too; the others only short ones
	histLongKeys     = 2
)

// histChecks are the checks run on the history.
var histChecks = []string{
	"one outcome per record lifetime", "fn starts at most once per call", "every replay equals a committed result",
	"what the client sees is what was committed", "a stale owner never completes", "a waiter gets a result within its wait",
	"errors agree with the history", "typed errors", "the caller's transaction stays usable",
	"a plain error means nothing committed", "at most one live lease per key",
	"a taken key never starts a mutation",
}

// histModes are the ways a call of Do or DoTx claims its key.
var histModes = []string{"Default", "ClaimWithFirstStatement", "ClaimFirst", "LookUpFirst", "Optimistic"}

func histDoOpts(mode string, wait time.Duration) *ledger.DoOpts {
	m := map[string]ledger.Mode{"Default": 0, "ClaimWithFirstStatement": ledger.ModeClaimWithFirstStatement,
		"ClaimFirst": ledger.ModeClaimFirst, "LookUpFirst": ledger.ModeLookUpFirst, "Optimistic": ledger.ModeOptimistic}[mode]
	return &ledger.DoOpts{Wait: wait, Mode: m}
}

// hcall is one call of a client, and what became of it.
type hcall struct {
	id       int64
	client   int
	op       string // Do, DoTx, Ext
	mode     string
	key      string
	payload  int
	fnKind   string
	wait     time.Duration
	deadline time.Duration // a context deadline shorter than the wait, or 0
	iso      pgx.TxIsoLevel
	exec     string

	startSeq, endSeq   int
	startStub, endStub time.Time

	fnStarts atomic.Int32
	fnAt     time.Time // the stub time fn read when it started

	// The start witness (see prepareWitness): armed, the mutation's first statement
	// (DoStatement's statement) records that it ran, and the key's record it then saw,
	// in a sequence, which no rollback undoes; read back once the call returned.
	witness bool
	begun   bool  // the first statement ran during the call
	saw     int64 // the call whose record of the key it saw: 0 none, -1 one it cannot name

	res       ledger.Result
	err       error
	kind      string // the outcome's class, see classify
	committed bool   // DoTx: the caller's transaction committed
	commitSeq int    // DoTx: when the caller's transaction committed
	commitErr error  // DoTx: why the commit failed
	unusable  error  // DoTx: the caller's transaction refused a statement after the call

	// The external mode: the lease taken, and how the finish went.
	token     string
	until     time.Time // when the claim's lease runs out, by the stub clock
	extends   []extension
	finish    string
	finishOK  bool
	finishErr error
	finishSeq int
}

// extension is a successful Extend of a lease: the lease ran until until from the
// log's entry seq on.
type extension struct {
	start, seq int
	until      time.Time
}

// histEnv is what the clients share.
type histEnv struct {
	t       *testing.T
	run     history.Run
	log     *history.Log
	clock   *pgtest.Clock
	ledgers map[string]*ledger.Ledger // by exec mode
	execs   []string
	pools   []*pgxpool.Pool // a pool on each shard
	schema  string
	// tenants are the tenants keys are spread over: one on each shard.
	tenants []string
	// crash is the shard a sharded run crash-restarts now and then; nil for one shard.
	crash  *pgtest.Cluster
	nextID atomic.Int64
	// proxies carry the ledgers' connections to each server, injecting the TCP faults.
	proxies map[string]*faultproxy.Proxy
	// bursts carries keys to the burst clients (see histBurstClients).
	bursts chan string

	mu    sync.Mutex
	calls []*hcall
}

func (e *histEnv) add(c *hcall) {
	e.mu.Lock()
	e.calls = append(e.calls, c)
	e.mu.Unlock()
}

func (e *histEnv) event(c *hcall, kind, detail string) int {
	return e.log.Add(history.Event{Client: c.client, Kind: kind, Op: c.op + "/" + c.mode, Key: c.key, Detail: detail})
}

// TestHistoryLedger runs many clients against one ledger on a small key space, with
// faults and a clock that makes records expire and leases lapse mid-run, records every
// call, fn start and committed effect, and checks the ledger's contract on the history.
func TestHistoryLedger(t *testing.T) {
	ctx := context.Background()
	run := history.Start(t, "./ledger", 20*time.Second)
	_, b := setup(t, nil)
	e := &histEnv{t: t, run: run, log: history.NewLog(), clock: b.clock, ledgers: map[string]*ledger.Ledger{},
		pools: []*pgxpool.Pool{b.pool}, schema: b.schema, tenants: []string{"acme"}}
	_, err := b.pool.Exec(ctx, histEffectsTable)
	require.NoError(t, err)
	for _, mode := range pgtest.ExecModes {
		l, err := ledger.New(e.execPool(pgtest.URL(t), mode), e.config())
		require.NoError(t, err)
		e.addLedger(mode, l)
	}
	e.runAll()
}

// TestHistoryLedgerSharded is TestHistoryLedger on a ledger over two shards, keys
// spread over a tenant on each, with the second shard crash-restarted now and then
// besides the other faults.
func TestHistoryLedgerSharded(t *testing.T) {
	s := pgtest.NewSharded(t, migrateLedger, histEffectsTable)
	run := history.Start(t, "./ledger", 10*time.Second)
	pools := []*pgxpool.Pool{s.A, s.B}
	urls := []string{pgtest.URL(t), s.Cluster.ConnString()}
	e := &histEnv{t: t, run: run, log: history.NewLog(), clock: pgtest.NewClock(t, s.A), ledgers: map[string]*ledger.Ledger{},
		pools: pools, schema: s.Schema, crash: s.Cluster}
	names := []string{"a", "b"}
	pick := shard.Hash(names...)
	for _, want := range names {
		for i := 0; ; i++ {
			if tenant := "tenant-" + strconv.Itoa(i); must(pick(tenant)) == want {
				e.tenants = append(e.tenants, tenant)
				break
			}
		}
	}
	for _, mode := range pgtest.ExecModes {
		var shards []shard.Shard
		for i, url := range urls {
			shards = append(shards, shard.Shard{Name: names[i], Pool: e.execPool(url, mode)})
		}
		r, err := shard.New(shards, pick)
		require.NoError(t, err)
		l, err := ledger.NewSharded(r, e.config())
		require.NoError(t, err)
		e.addLedger(mode, l)
	}
	e.runAll()
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

const histEffectsTable = `CREATE TABLE effects (key text NOT NULL, call_id bigint PRIMARY KEY, at timestamptz NOT NULL)`

func (e *histEnv) config() *ledger.Config {
	return &ledger.Config{Schema: e.schema, Retention: histRetention, Lease: histLease, Test: ledger.TestConfig{NowFunc: e.clock.Now}}
}

// histFaults is the TCP fault plan of the ledgers' connections: cuts, delays and
// half-closes at message boundaries, and COMMITs whose answer is lost or replaced by a
// FATAL after the server ran them.
func histFaults(seed uint64) faultproxy.Plan {
	return faultproxy.Plan{Seed: seed, Cut: 0.002, CutAnswer: 0.001, HalfClose: 0.001, Delay: 0.02,
		CommitLost: 0.02, CommitFatal: 0.02}
}

// proxy is the fault proxy to the server of url, started on first use.
func (e *histEnv) proxy(url string) *faultproxy.Proxy {
	if p, ok := e.proxies[url]; ok {
		return p
	}
	plan := histFaults(e.run.Seed + uint64(len(e.proxies)))
	plan.FaultFunc = func(kind string, conn int, detail string) {
		if kind != faultproxy.Delay {
			e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "tcp " + kind, Detail: fmt.Sprintf("conn %d %s", conn, detail)})
		}
	}
	p := faultproxy.Start(e.t, url, plan)
	if e.proxies == nil {
		e.proxies = map[string]*faultproxy.Proxy{}
	}
	e.proxies[url] = p
	return p
}

// execPool is a pool on url that sends statements in mode, through the fault proxy.
func (e *histEnv) execPool(url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	p := e.proxy(url)
	return pgtest.PoolOn(e.t, url, e.schema, func(c *pgxpool.Config) {
		p.Route(&c.ConnConfig.Config)
		c.MaxConns = 6
		c.ConnConfig.DefaultQueryExecMode = mode
		c.ConnConfig.RuntimeParams["application_name"] = "oncekit-history"
		c.ConnConfig.ConnectTimeout = 2 * time.Second
	})
}

func (e *histEnv) addLedger(mode pgx.QueryExecMode, l *ledger.Ledger) {
	e.ledgers[mode.String()] = l
	e.execs = append(e.execs, mode.String())
	sort.Strings(e.execs)
}

// runAll runs the clients and the faults for the run's duration, then checks the history.
func (e *histEnv) runAll() {
	t := e.t
	e.prepareWitness()
	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Go(func() { e.moveClock(stop) })
	faults.Go(func() { e.purge(stop) })
	faults.Go(func() { e.killBackends(stop) })
	if e.crash != nil {
		faults.Go(func() { e.crashShard(stop) })
	}

	deadline := time.Now().Add(e.run.Duration)
	e.bursts = make(chan string)
	var clients sync.WaitGroup
	for i := range histClients {
		clients.Go(func() {
			rng := e.run.Rand(i)
			for time.Now().Before(deadline) {
				e.step(i, rng, "")
			}
		})
	}
	for i := histClients; i < histClients+histBurstClients; i++ {
		clients.Go(func() {
			rng := e.run.Rand(i)
			end := time.After(time.Until(deadline))
			for {
				select {
				case key := <-e.bursts:
					e.step(i, rng, key)
				case <-end:
					return
				}
			}
		})
	}
	clients.Wait()
	close(stop)
	faults.Wait()
	for _, p := range e.proxies {
		p.SetEnabled(false)
		var counts []string
		for _, k := range []string{faultproxy.Cut, faultproxy.CutAnswer, faultproxy.HalfCloseServer, faultproxy.HalfCloseClient,
			faultproxy.Delay, faultproxy.CommitLost, faultproxy.CommitFatal} {
			counts = append(counts, fmt.Sprintf("%s %d", k, p.Count(k)))
		}
		t.Logf("history: TCP faults: %s", strings.Join(counts, ", "))
	}

	ops := e.check()
	t.Logf("history: %d calls, %d events, seed %d", ops, e.log.Len(), e.run.Seed)
	e.log.DumpOnFailure(t)
}

// crashShard crash-restarts the second shard now and then, for a moment.
func (e *histEnv) crashShard(stop chan struct{}) {
	rng := e.run.Rand(1003)
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(1000+rng.IntN(2000)) * time.Millisecond):
		}
		down := time.Duration(50+rng.IntN(300)) * time.Millisecond
		e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "crash", Detail: "shard b, down " + down.String()})
		if err := e.crash.Crash(context.Background(), down); err != nil {
			e.t.Errorf("crash shard b: %v", err)
			return
		}
	}
}

// moveClock advances the stubbed clock about as fast as real time, with an occasional
// jump past the retention.
func (e *histEnv) moveClock(stop chan struct{}) {
	rng := e.run.Rand(1000)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		d := time.Duration(rng.IntN(20)) * time.Millisecond
		if rng.IntN(400) == 0 {
			d = histRetention + time.Duration(rng.IntN(500))*time.Millisecond
			e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "clock", Detail: "jump " + d.String()})
		}
		e.clock.Advance(d)
	}
}

// purge runs the ledger's purge in small batches while the clients work.
func (e *histEnv) purge(stop chan struct{}) {
	rng := e.run.Rand(1001)
	l := e.ledgers[e.execs[0]]
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(20+rng.IntN(150)) * time.Millisecond):
		}
		start := e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "purge", Detail: "start"})
		// Over shards, a purge that fails on a crashed shard has still purged the others.
		res, _ := l.Purge(context.Background(), &ledger.PurgeOpts{BatchSize: 1 + rng.IntN(4)})
		if res.Deleted > 0 {
			e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "purge", Detail: fmt.Sprintf("deleted %d (started #%d)", res.Deleted, start)})
		}
	}
}

// killBackends terminates a random backend of the clients' pools now and then.
func (e *histEnv) killBackends(stop chan struct{}) {
	rng := e.run.Rand(1002)
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(100+rng.IntN(600)) * time.Millisecond):
		}
		var pid int32
		pool := e.pools[rng.IntN(len(e.pools))]
		err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE application_name = 'oncekit-history' AND state <> 'idle' ORDER BY random() LIMIT 1`).Scan(&pid)
		if err != nil {
			continue
		}
		if _, err := pool.Exec(context.Background(), "SELECT pg_terminate_backend($1::int)", pid); err == nil {
			e.log.Add(history.Event{Client: -1, Kind: "fault", Op: "terminate", Detail: "backend " + strconv.Itoa(int(pid))})
		}
	}
}

// scope is the scope of key: its tenant is one of the run's, chosen by the key.
func (e *histEnv) scope(op, key string) keys.Scope {
	return keys.Scope{Tenant: e.tenants[e.shardOf(key)], Operation: op}
}

// shardOf is the index of key's tenant in tenants, and of its shard's pool in pools.
func (e *histEnv) shardOf(key string) int {
	h := 0
	for _, b := range []byte(key) {
		h = h*31 + int(b)
	}
	return h % len(e.tenants)
}

func (e *histEnv) intent(op, key string, payload int) ledger.Intent {
	fp, _ := keys.FingerprintJSON(map[string]int{"payload": payload})
	return ledger.Intent{Scope: e.scope(op, key), Key: keys.Key(key), Fingerprint: fp}
}

// step runs one call chosen by rng, on key when it is not "" (a burst's: not Ext).
func (e *histEnv) step(client int, rng *rand.Rand, key string) {
	c := &hcall{id: e.nextID.Add(1), client: client, exec: e.execs[rng.IntN(len(e.execs))]}
	switch n := rng.IntN(100); {
	case n < 12 && !pgtest.IsCitus(): // DoStatement does not run on Citus yet
		c.op = "Stmt"
	case n < 55 || n >= 75 && key != "":
		c.op = "Do"
	case n < 75:
		c.op = "DoTx"
	default:
		c.op = "Ext"
	}
	if c.op == "Ext" {
		c.key = "e" + strconv.Itoa(rng.IntN(histExtKeys))
		e.external(c, rng)
		e.add(c)
		return
	}
	c.key = "k" + strconv.Itoa(rng.IntN(histDoKeys))
	if rng.IntN(2) == 0 {
		c.key = "k" + strconv.Itoa(rng.IntN(3)) // a few hot keys, on which many calls wait
	}
	if key != "" {
		c.key = key
	}
	c.mode = histModes[rng.IntN(len(histModes))]
	if rng.IntN(40) == 0 {
		c.payload = 1 // the same key with another payload
	}
	fnKinds := []string{"ok", "ok", "ok", "ok", "nostmt", "slow", "retryable", "definitive", "sqlerr", "panic"}
	c.fnKind = fnKinds[rng.IntN(len(fnKinds))]
	if rng.IntN(3) > 0 {
		c.wait = time.Duration(50+rng.IntN(1500)) * time.Millisecond
	}
	if rng.IntN(10) == 0 {
		c.deadline = time.Duration(10+rng.IntN(300)) * time.Millisecond
	}
	c.iso = pgx.ReadCommitted
	if n := rng.IntN(10); n == 0 {
		c.iso = pgx.RepeatableRead
	} else if n == 1 {
		c.iso = pgx.Serializable
	}
	commit := rng.IntN(8) > 0
	// Most mutations begin with the start witness; the others keep the effect's INSERT
	// as their first statement. A caller's snapshot older than the call (REPEATABLE
	// READ, SERIALIZABLE) would hide what the witness looks for: those go without.
	c.witness = histWitness() && c.fnKind != "nostmt" && (c.op != "DoTx" || c.iso == pgx.ReadCommitted) && rng.IntN(4) > 0
	if c.op == "Stmt" {
		e.statement(c, rng)
		e.add(c)
		return
	}
	e.guarded(c, rng, commit)
	e.add(c)
}

// fn is the mutation of call c: it writes an effect row named after the call, so the
// committed effects can be read back at the end.
func (e *histEnv) fn(c *hcall, rng *rand.Rand) ledger.Func {
	slow := time.Duration(rng.IntN(60)) * time.Millisecond
	var delay time.Duration // holds the key a while, so that other calls meet it in flight
	if rng.IntN(2) == 0 {
		delay = time.Duration(1+rng.IntN(30)) * time.Millisecond
	}
	if c.fnKind == "retryable" {
		delay = time.Duration(20+rng.IntN(150)) * time.Millisecond // a holder that fails while others wait
	}
	return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		c.fnStarts.Add(1)
		c.fnAt = e.clock.Now()
		e.event(c, "start", "fn "+c.fnKind)
		time.Sleep(delay)
		body := []byte("c" + strconv.FormatInt(c.id, 10))
		write := func() error {
			_, err := tx.Exec(ctx, "INSERT INTO effects (key, call_id, at) VALUES ($1, $2, $3)", c.key, c.id, c.fnAt)
			return err
		}
		if c.witness {
			// The mutation's first statement; in ModeClaimWithFirstStatement and in DoTx
			// the claim travels with it.
			sc := e.scope("do", c.key)
			if _, err := tx.Exec(ctx, "SELECT "+e.witnessFunc()+"($1::text::regclass, $2::bigint, $3::text, $4::text, $5::text)",
				e.witnessSeq(c.client), c.id, sc.Tenant, sc.Operation, c.key); err != nil {
				return ledger.Response{}, err
			}
		}
		switch c.fnKind {
		case "nostmt":
			return ledger.Response{Code: 200, Body: body}, nil
		case "slow":
			time.Sleep(slow)
		case "retryable":
			if err := write(); err != nil {
				return ledger.Response{}, err
			}
			return ledger.Response{}, errors.New("retryable failure")
		case "definitive":
			if err := write(); err != nil {
				return ledger.Response{}, err
			}
			return ledger.Response{}, ledger.Definitive("declined", string(body))
		case "sqlerr":
			_, _ = tx.Exec(ctx, "SELECT 1/0")
			return ledger.Response{}, ledger.Definitive("declined", string(body))
		case "panic":
			if err := write(); err != nil {
				return ledger.Response{}, err
			}
			panic("fn panics")
		}
		if err := write(); err != nil {
			return ledger.Response{}, err
		}
		if c.op == "Do" {
			e.burst(c.key) // the ledger commits next
		}
		return ledger.Response{Code: 201, Body: body}, nil
	}
}

// burst hands key to the burst clients that are idle.
func (e *histEnv) burst(key string) {
	for range histBurstClients {
		select {
		case e.bursts <- key:
		default:
			return
		}
	}
}

// guarded runs a Do or a DoTx.
func (e *histEnv) guarded(c *hcall, rng *rand.Rand, commit bool) {
	l := e.ledgers[c.exec]
	in := e.intent("do", c.key, c.payload)
	ctx := context.Background()
	if c.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.deadline)
		defer cancel()
	}
	opts := histDoOpts(c.mode, c.wait)
	c.startStub = e.clock.Now()
	c.startSeq = e.event(c, "call", fmt.Sprintf("id=%d fn=%s payload=%d wait=%s deadline=%s iso=%s exec=%s", c.id, c.fnKind, c.payload, c.wait, c.deadline, c.iso, c.exec))
	defer func() {
		if r := recover(); r != nil {
			c.err, c.kind = fmt.Errorf("panic: %v", r), "panic"
		}
		c.endStub = e.clock.Now()
		c.endSeq = e.event(c, "return", c.describe())
	}()
	if c.op == "Do" {
		c.res, c.err = l.Do(ctx, in, e.fn(c, rng), opts)
		c.kind = classify(c.err)
		e.readWitness(c)
		return
	}
	pool, err := l.Router().Pool(in.Scope.Tenant)
	if err != nil {
		c.err, c.kind = err, "conn"
		return
	}
	tx, err := pool.BeginTx(context.Background(), pgx.TxOptions{IsoLevel: c.iso})
	if err != nil {
		c.err, c.kind = err, "conn"
		return
	}
	defer tx.Rollback(context.Background())
	if c.iso != pgx.ReadCommitted {
		_, _ = tx.Exec(context.Background(), "SELECT count(*) FROM effects") // take the snapshot before the call
	}
	c.res, c.err = func() (res ledger.Result, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		return l.DoTx(ctx, tx, in, e.fn(c, rng), opts)
	}()
	c.kind = classify(c.err)
	e.readWitness(c)
	if strings.HasPrefix(fmt.Sprint(c.err), "panic:") {
		c.kind = "panic"
	}
	if c.kind != "conn" && c.kind != "ctx" && !tx.Conn().IsClosed() {
		if _, err := tx.Exec(context.Background(), "SELECT 1"); err != nil && classify(err) != "conn" {
			c.unusable = err
		}
	}
	if commit && c.kind != "panic" {
		if err := tx.Commit(context.Background()); err != nil {
			c.commitErr = err
		} else {
			c.committed = true
			c.commitSeq = e.event(c, "commit", fmt.Sprintf("id=%d", c.id))
		}
	}
}

// statement runs a DoStatement whose statement writes the call's effect row and
// returns the body a Do of the call would, or fails (fn kind sqlerr). The call counts
// as one that commits by itself, as Do does; its effect's time is the call's start.
func (e *histEnv) statement(c *hcall, rng *rand.Rand) {
	l := e.ledgers[c.exec]
	c.mode, c.committed = "Statement", true
	if rng.IntN(5) == 0 {
		c.fnKind = "sqlerr"
	} else {
		c.fnKind = "ok"
	}
	ctx := context.Background()
	if c.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.deadline)
		defer cancel()
	}
	c.startStub = e.clock.Now()
	c.fnAt = c.startStub
	c.startSeq = e.event(c, "call", fmt.Sprintf("id=%d stmt=%s payload=%d wait=%s deadline=%s exec=%s", c.id, c.fnKind, c.payload, c.wait, c.deadline, c.exec))
	div := 1
	if c.fnKind == "sqlerr" {
		div = 0
	}
	st := ledger.Statement{SQL: `INSERT INTO effects (key, call_id, at) VALUES ($1, $2::bigint / $4::int * $4::int, $3) RETURNING 'c' || call_id AS b`,
		Args: []any{c.key, c.id, c.fnAt, div}, Code: 201}
	if c.witness {
		// The witness runs as the statement starts to write, before its division.
		sc := e.scope("do", c.key)
		st.SQL = `INSERT INTO effects (key, call_id, at) VALUES ($1,
			0 * ` + e.witnessFunc() + `($5::text::regclass, $2::bigint, $6::text, $7::text, $1::text) + $2::bigint / $4::int * $4::int, $3)
			RETURNING 'c' || call_id AS b`
		st.Args = append(st.Args, e.witnessSeq(c.client), sc.Tenant, sc.Operation)
	}
	c.res, c.err = l.DoStatement(ctx, e.intent("do", c.key, c.payload), st, &ledger.StatementOpts{Wait: c.wait})
	c.kind = classify(c.err)
	e.readWitness(c)
	if c.kind == "other" && c.fnKind == "sqlerr" && strings.Contains(c.err.Error(), "division by zero") {
		c.kind = "stmterr"
	}
	c.endStub = e.clock.Now()
	c.endSeq = e.event(c, "return", c.describe())
}

// external runs one external-mode flow: claim, maybe stall past the lease, finish. Some
// claims take a lease longer than the retention, and some extend theirs past it: a
// pending record must outlive its lease however long that is.
func (e *histEnv) external(c *hcall, rng *rand.Rand) {
	l := e.ledgers[c.exec]
	c.op, c.mode = "Ext", "Claim"
	in := e.intent("ext", c.key, 0)
	ctx := context.Background()
	opts := &ledger.ClaimOpts{}
	if rng.IntN(2) == 0 {
		opts.Wait = time.Duration(rng.IntN(400)) * time.Millisecond
	}
	// The keys that take long leases also stay held for long; on the others stale
	// owners come often: a holder stalls past its short lease while others wait.
	long := c.key < "e"+strconv.Itoa(histLongKeys) && rng.IntN(2) == 0
	if long {
		opts.Lease = histRetention + time.Duration(rng.IntN(int(2*histRetention/time.Millisecond)))*time.Millisecond
	}
	c.startStub = e.clock.Now()
	c.startSeq = e.event(c, "call", fmt.Sprintf("id=%d claim wait=%s lease=%s", c.id, opts.Wait, opts.Lease))
	cr, err := l.Claim(ctx, in, opts)
	c.res, c.err, c.kind = cr.Result, err, classify(err)
	if cr.Lease != nil {
		c.token, c.until = cr.Lease.Token.String(), cr.Lease.Until
	}
	c.endStub = e.clock.Now()
	c.endSeq = e.event(c, "return", c.describe()+" token="+c.token+" until="+c.until.Format("15:04:05.000"))
	if cr.Lease == nil {
		return
	}
	switch {
	case long && rng.IntN(2) == 0:
		// Hold the long lease past the retention: the record must stay the holder's.
		time.Sleep(histRetention + time.Duration(rng.IntN(int(histRetention/time.Millisecond)))*time.Millisecond)
	case rng.IntN(3) == 0:
		// A stall that outlives the lease, so that another attempt takes the key over
		// and this holder's finish comes stale.
		time.Sleep(histLease + time.Duration(rng.IntN(int(histLease/time.Millisecond)))*time.Millisecond)
	}
	lease := cr.Lease
	body := []byte("x" + strconv.FormatInt(c.id, 10))
	finishes := []string{"Complete", "Complete", "Complete", "Fail", "Release", "MarkUncertain", "ExtendComplete"}
	c.finish = finishes[rng.IntN(len(finishes))]
	start := e.log.Add(history.Event{Client: c.client, Kind: "call", Op: "Ext/" + c.finish, Key: c.key, Detail: "token=" + c.token})
	c.finishSeq = start
	switch c.finish {
	case "Complete":
		_, err = l.Complete(ctx, lease, ledger.Response{Code: 200, Body: body})
	case "Fail":
		err = l.Fail(ctx, lease, ledger.Definitive("declined", string(body)))
	case "Release":
		err = l.Release(ctx, lease)
	case "MarkUncertain":
		err = l.MarkUncertain(ctx, lease)
	case "ExtendComplete":
		d := histLease
		if rng.IntN(2) == 0 {
			d = 2 * histRetention
		}
		extStart := e.log.Add(history.Event{Client: c.client, Kind: "call", Op: "Ext/Extend", Key: c.key, Detail: "token=" + c.token + " for " + d.String()})
		if err = l.Extend(ctx, lease, d); err == nil {
			seq := e.log.Add(history.Event{Client: c.client, Kind: "return", Op: "Ext/Extend", Key: c.key,
				Detail: fmt.Sprintf("token=%s until=%s", c.token, lease.Until.Format("15:04:05.000"))})
			c.extends = append(c.extends, extension{start: extStart, seq: seq, until: lease.Until})
			if d > histLease {
				time.Sleep(histRetention + time.Duration(rng.IntN(int(histRetention/2/time.Millisecond)))*time.Millisecond)
			}
			c.finishSeq = e.log.Add(history.Event{Client: c.client, Kind: "call", Op: "Ext/Complete", Key: c.key, Detail: "token=" + c.token})
			_, err = l.Complete(ctx, lease, ledger.Response{Code: 200, Body: body})
		}
	}
	c.finishOK, c.finishErr = err == nil, err
	e.log.Add(history.Event{Client: c.client, Kind: "return", Op: "Ext/" + c.finish, Key: c.key, Detail: fmt.Sprintf("token=%s err=%v", c.token, err)})
}

func (c *hcall) describe() string {
	if c.err != nil {
		return fmt.Sprintf("id=%d %s: %v", c.id, c.kind, c.err)
	}
	return fmt.Sprintf("id=%d ok replayed=%v body=%s", c.id, c.res.Replayed, c.res.Body)
}

// classify names the class of a call's error.
func classify(err error) string {
	var derr *ledger.DefinitiveError
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		return "unknown"
	case errors.As(err, &derr):
		return "definitive"
	case errors.Is(err, ledger.ErrInProgress):
		return "inprogress"
	case errors.Is(err, ledger.ErrFingerprintMismatch):
		return "mismatch"
	case errors.Is(err, ledger.ErrSnapshotConflict):
		return "snapshot"
	case errors.Is(err, ledger.ErrLeaseLost):
		return "leaselost"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "ctx"
	case err.Error() == "retryable failure":
		return "retryable"
	case errors.As(err, &pgErr) && (pgErr.Code == "57P01" || pgErr.Code == "40001" || pgErr.Code == "40P01"):
		return "conn" // terminated backend, or the caller's own serialization failure
	case errors.As(err, &connectErr), errors.As(err, &pgErr) && (pgErr.Code == "57P02" || pgErr.Code == "57P03"):
		return "conn" // a crashed shard: down, or starting up
	case pgconn.SafeToRetry(err), errors.Is(err, pgx.ErrTxClosed), strings.Contains(err.Error(), "conn closed"),
		strings.Contains(err.Error(), "unexpected EOF"), strings.Contains(err.Error(), "connection reset"),
		strings.Contains(err.Error(), "broken pipe"), strings.Contains(err.Error(), "terminating connection"),
		strings.Contains(err.Error(), "closed pool"), strings.Contains(err.Error(), "conn busy"):
		return "conn"
	}
	return "other"
}

// outcome is a committed result of a key: a success or a stored failure. Its record
// was written at a time no earlier than at (fn's start), and it replaced only a record
// of the key that had expired by the clock of its claim, read no later than by, the
// call's end.
type outcome struct {
	callID int64
	at, by time.Time
	failed bool
	known  bool // the call that produced it reported it (not only the effects table)
	call   *hcall
}

// check runs every check on the history and returns the number of calls.
func (e *histEnv) check() int {
	t := e.t
	ctx := context.Background()
	byID := map[int64]*hcall{}
	for _, c := range e.calls {
		byID[c.id] = c
	}
	effects := map[int64]time.Time{}
	for _, pool := range e.pools {
		var rows pgx.Rows
		require.Eventually(t, func() bool { // a shard may be coming back from a crash
			var err error
			rows, err = pool.Query(ctx, "SELECT call_id, at FROM effects")
			return err == nil
		}, 30*time.Second, 100*time.Millisecond)
		for rows.Next() {
			var id int64
			var at time.Time
			require.NoError(t, rows.Scan(&id, &at))
			effects[id] = at
		}
		require.NoError(t, rows.Err())
	}

	var vs []history.Violation
	bad := func(check string, c *hcall, format string, args ...any) {
		var events []history.Event
		for _, ev := range e.log.Of(c.key) {
			if ev.Seq <= c.doneSeq() {
				events = append(events, ev)
			}
		}
		vs = append(vs, history.Violation{Check: check, Key: c.key,
			What:   fmt.Sprintf("call %d (%s/%s, fn %s): ", c.id, c.op, c.mode, c.fnKind) + fmt.Sprintf(format, args...),
			Events: events})
	}

	// The committed outcomes of each key: fn's effects as the table holds them, and the
	// results a call reported as committed where fn wrote nothing (no statement, or a
	// stored failure).
	outcomes := map[string][]outcome{}
	for id, at := range effects {
		c := byID[id]
		outcomes[c.key] = append(outcomes[c.key], outcome{callID: id, at: at, by: c.endStub, call: c, known: c.err == nil && (c.op == "Do" || c.committed)})
	}
	for _, c := range e.calls {
		if c.op == "Ext" {
			continue
		}
		committed := c.op == "Do" || c.committed
		var derr *ledger.DefinitiveError
		switch {
		case c.err == nil && !c.res.Replayed && c.fnKind == "nostmt" && committed:
			outcomes[c.key] = append(outcomes[c.key], outcome{callID: c.id, at: c.fnAt, by: c.endStub, call: c, known: true})
		case errors.As(c.err, &derr) && !derr.Replayed && committed:
			outcomes[c.key] = append(outcomes[c.key], outcome{callID: c.id, at: c.fnAt, by: c.endStub, call: c, known: true, failed: true})
		}
	}
	committedBy := map[int64]outcome{}
	for key, os := range outcomes {
		sort.Slice(os, func(i, j int) bool { return os[i].at.Before(os[j].at) })
		outcomes[key] = os
		for i, o := range os {
			committedBy[o.callID] = o
			for _, prev := range os[:i] {
				// Each record was written between its at and by, and lived for the
				// retention at least: two records whose writes are closer than that
				// however they fell in those spans cannot both belong to the key.
				if spread := max(o.by.Sub(prev.at), prev.by.Sub(o.at)); spread < histRetention {
					bad("one outcome per record lifetime", o.call, "recorded within [%s, %s], call %d within [%s, %s]: at most %s apart, within the retention",
						o.at.Format("15:04:05.000"), o.by.Format("15:04:05.000"), prev.callID,
						prev.at.Format("15:04:05.000"), prev.by.Format("15:04:05.000"), spread)
				}
			}
		}
	}

	// The external mode: the leases granted on each key.
	grants := map[string][]*hcall{}
	for _, c := range e.calls {
		if c.op == "Ext" && c.token != "" {
			grants[c.key] = append(grants[c.key], c)
		}
	}

	// At most one live lease per key: a claim granted while another holder's lease
	// was live by the clock (the lease as claimed, or as extended before) and that
	// holder had not finished is a second owner.
	for _, gs := range grants {
		for _, a := range gs {
			for _, b := range gs {
				if a == b || b.startSeq < a.endSeq || a.finishSeq < b.endSeq {
					continue
				}
				// Extend renews the lease from its own time, which may end it sooner than
				// the claim did: the lease is the last one known before b began, and an
				// extension in flight while b claimed leaves it unknown.
				until, unknown := a.until, false
				for _, x := range a.extends {
					switch {
					case x.seq < b.startSeq:
						until = x.until
					case x.start < b.endSeq:
						unknown = true
					}
				}
				if unknown {
					continue
				}
				if b.endStub.Before(until) {
					bad("at most one live lease per key", b, "claimed with token %s by %s, while call %d's lease with token %s ran until %s and was not finished",
						b.token, b.endStub.Format("15:04:05.000"), a.id, a.token, until.Format("15:04:05.000"))
				}
			}
		}
	}

	for _, c := range e.calls {
		if c.op == "Ext" {
			e.checkExtReplay(c, byID, bad)
			if c.kind == "other" {
				bad("typed errors", c, "claim: unexpected error %v", c.err)
			}
			if c.finishErr != nil && classify(c.finishErr) == "other" {
				bad("typed errors", c, "%s: unexpected error %v", c.finish, c.finishErr)
			}
			if c.finishOK && c.finish != "Release" && c.finish != "MarkUncertain" {
				for _, g := range grants[c.key] {
					if g.token != c.token && g.endSeq > c.endSeq && g.endSeq < c.finishSeq {
						bad("a stale owner never completes", c, "%s with token %s succeeded after call %d took the key over with token %s",
							c.finish, c.token, g.id, g.token)
					}
				}
			}
			continue
		}
		if _, ok := effects[c.id]; ok && (c.op == "Do" || c.op == "Stmt") && c.err != nil && c.kind != "unknown" {
			bad("a plain error means nothing committed", c, "returned %s (%v), yet its effect committed", c.kind, c.err)
		}
		if n := c.fnStarts.Load(); n > 1 {
			bad("fn starts at most once per call", c, "fn started %d times", n)
		}
		// A taken key never starts a mutation: the witness, the mutation's first
		// statement, ran after the claim, with the key's lock held since before the
		// claim's snapshot, and saw a record another call taking that lock committed
		// (under the lock, so before this call took it: the claim saw it too). Its record
		// expires a retention after the stub time of that call's start at the earliest,
		// and the claim read the clock before this call returned: when that is sooner,
		// the record was live for the claim, which had to refuse the key.
		if c.begun && c.saw > 0 && c.saw != c.id && histLocking(c) {
			if x := byID[c.saw]; x != nil && x.key == c.key && histLocking(x) && c.endStub.Before(x.startStub.Add(histRetention)) {
				bad("a taken key never starts a mutation", c, "its first statement ran, seeing call %d's record (%s/%s, returned at #%d, committed at #%d), "+
					"live until %s at least, while the call's clock read at most %s",
					x.id, x.op, x.mode, x.endSeq, x.doneSeq(), x.startStub.Add(histRetention).Format("15:04:05.000"), c.endStub.Format("15:04:05.000"))
			}
		}
		if c.kind == "other" {
			bad("typed errors", c, "unexpected error: %v", c.err)
		}
		if c.kind == "panic" && c.fnKind != "panic" {
			bad("typed errors", c, "panicked: %v", c.err)
		}
		if c.unusable != nil {
			bad("the caller's transaction stays usable", c, "after the call: %v", c.unusable)
		}
		if c.kind == "snapshot" && c.iso == pgx.ReadCommitted {
			bad("errors agree with the history", c, "snapshot conflict under READ COMMITTED")
		}
		// What the client sees is what was committed.
		var derr *ledger.DefinitiveError
		switch {
		case c.err == nil && c.res.Replayed:
			e.checkReplay(c, string(c.res.Body), false, committedBy, byID, bad)
		case errors.As(c.err, &derr) && derr.Replayed:
			e.checkReplay(c, derr.Message, true, committedBy, byID, bad)
		case c.err == nil && c.fnKind != "nostmt":
			_, ok := effects[c.id]
			if want := c.op == "Do" || c.committed; ok != want && classify(c.commitErr) != "conn" {
				bad("what the client sees is what was committed", c, "reported a first execution; effect committed: %v, expected %v", ok, want)
			}
		}
		var ipe *ledger.InProgressError
		if errors.As(c.err, &ipe) {
			// An optimistic call whose commit met a record that a purge removed before
			// the call could read it has nothing to replay, and may not run fn again.
			purged := c.mode == "Optimistic" && e.purgedDuring(c)
			if c.wait > 0 && (c.deadline == 0 || c.deadline > c.wait) && ipe.Waited < c.wait-100*time.Millisecond && !purged {
				bad("a waiter gets a result within its wait", c, "in progress after waiting %s of %s", ipe.Waited, c.wait)
			}
			for _, o := range outcomes[c.key] {
				if o.known && o.call.doneSeq() < c.startSeq && c.endStub.Before(o.at.Add(histRetention)) {
					bad("errors agree with the history", c, "in progress, while call %d's outcome was committed and live", o.callID)
					break
				}
			}
		}
	}
	kinds := map[string]int{}
	armed, begun, saw := 0, 0, 0
	for _, c := range e.calls {
		kinds[c.op+" "+c.kind]++
		if c.witness {
			armed++
		}
		if c.begun {
			begun++
		}
		if c.saw != histWitnessNone {
			saw++
		}
	}
	t.Logf("history: outcomes %v", kinds)
	t.Logf("history: start witness: %d calls armed it, %d mutations began, %d of them seeing a record of the key", armed, begun, saw)
	if history.Report(t, vs, 40) == 0 {
		t.Logf("history: every check held: %s", strings.Join(histChecks, "; "))
	}
	return len(e.calls)
}

// purgedDuring reports whether a purge that deleted records ran while c did.
func (e *histEnv) purgedDuring(c *hcall) bool {
	for _, ev := range e.log.Events() {
		var n, start int
		if ev.Op != "purge" || ev.Seq < c.startSeq {
			continue
		}
		if _, err := fmt.Sscanf(ev.Detail, "deleted %d (started #%d)", &n, &start); err == nil && start < c.endSeq {
			return true
		}
	}
	return false
}

// doneSeq is when a call's outcome was committed, as far as the log knows.
func (c *hcall) doneSeq() int {
	if c.commitSeq > 0 {
		return c.commitSeq
	}
	return c.endSeq
}

// checkReplay checks that a replayed result is one a call committed.
func (e *histEnv) checkReplay(c *hcall, body string, failed bool, committedBy map[int64]outcome, byID map[int64]*hcall, bad func(string, *hcall, string, ...any)) {
	// A DoStatement's body is its statement's row, [{"b":"c<call>"}].
	var rows []struct{ B string }
	if json.Unmarshal([]byte(body), &rows) == nil && len(rows) == 1 {
		body = rows[0].B
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(body, "c"), 10, 64)
	producer := byID[id]
	if err != nil || producer == nil || producer.key != c.key {
		bad("every replay equals a committed result", c, "replayed %q, which no call on the key produced", body)
		return
	}
	if o, ok := committedBy[id]; ok {
		if o.failed != failed {
			bad("every replay equals a committed result", c, "replayed call %d's result as failed=%v; it committed failed=%v", id, failed, o.failed)
		}
		return
	}
	switch {
	case (producer.op == "Do" || producer.op == "Stmt") && producer.kind == "unknown":
		return // the producer's commit went unanswered, and it said so
	case producer.op == "DoTx" && producer.commitErr != nil:
		return // the caller's own commit (of a result or a stored failure) went unanswered
	case producer.err != nil && producer.kind != "definitive":
		bad("a plain error means nothing committed", c, "replayed call %d's result, which returned %s: %v", id, producer.kind, producer.err)
		return
	}
	bad("every replay equals a committed result", c, "replayed call %d's result, which was not committed (%s)", id, producer.describe())
}

// checkExtReplay checks that a result an external-mode claim replays was stored by a
// finish that did not say it failed (an unknown outcome aside).
func (e *histEnv) checkExtReplay(c *hcall, byID map[int64]*hcall, bad func(string, *hcall, string, ...any)) {
	var derr *ledger.DefinitiveError
	body := ""
	switch {
	case c.err == nil && c.res.Replayed:
		body = string(c.res.Body)
	case errors.As(c.err, &derr) && derr.Replayed:
		body = derr.Message
	default:
		return
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(body, "x"), 10, 64)
	producer := byID[id]
	if err != nil || producer == nil || producer.key != c.key || producer.op != "Ext" {
		bad("every replay equals a committed result", c, "replayed %q, which no claim on the key finished with", body)
		return
	}
	if producer.finishErr != nil && classify(producer.finishErr) != "unknown" {
		bad("a plain error means nothing committed", c, "replayed call %d's %s, which returned %v", id, producer.finish, producer.finishErr)
	}
}

// The start witness: a function a mutation calls as its first statement (and a
// DoStatement's statement as it starts to write). It looks for the key's record with a
// snapshot of its own (a volatile function's query takes one under READ COMMITTED, later
// than the claim's), and sets the client's sequence to the call and the call whose record
// it saw: histWitnessNone for no record, histWitnessUnknown for one it cannot name. A
// sequence keeps what it was set to through the rollback of the transaction that set it,
// so a statement that ran and then rolled back (at the record's primary key, say) still
// leaves its trace; a second run in the same call keeps a record the first one saw.
const (
	histWitnessBits    = 24
	histWitnessNone    = 0
	histWitnessUnknown = 1<<histWitnessBits - 1
)

// histWitness reports whether the start witness runs: not on Citus, whose distributed
// records table a function on the coordinator would read by way of the workers.
func histWitness() bool { return !pgtest.IsCitus() }

func (e *histEnv) witnessFunc() string { return pgx.Identifier{e.schema, "hist_started"}.Sanitize() }

// witnessSeq is the sequence of client's witness: a client makes one call at a time.
func (e *histEnv) witnessSeq(client int) string {
	return pgx.Identifier{e.schema, "hist_started_" + strconv.Itoa(client)}.Sanitize()
}

// prepareWitness creates the witness's function and sequences on every shard.
func (e *histEnv) prepareWitness() {
	if !histWitness() {
		return
	}
	records := pgx.Identifier{e.schema, "idempotency_records"}.Sanitize()
	fn := `CREATE OR REPLACE FUNCTION ` + e.witnessFunc() + `(seq regclass, caller_id bigint, t text, op text, k text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
DECLARE
	seen text;
	producer bigint := ` + strconv.Itoa(histWitnessNone) + `;
	prev bigint;
BEGIN
	SELECT coalesce(convert_from(body, 'UTF8'), '') || ' ' || coalesce(error_message, '') INTO seen
		FROM ` + records + ` WHERE tenant = t AND operation = op AND key = k AND attempts > 0;
	IF FOUND THEN
		producer := least(coalesce(substring(seen from 'c([0-9]+)')::bigint, ` + strconv.Itoa(histWitnessUnknown) + `), ` + strconv.Itoa(histWitnessUnknown) + `);
	END IF;
	prev := pg_sequence_last_value(seq);
	IF prev IS NULL OR prev >> ` + strconv.Itoa(histWitnessBits) + ` <> caller_id OR prev & ` + strconv.Itoa(histWitnessUnknown) + ` = ` + strconv.Itoa(histWitnessNone) + ` THEN
		PERFORM setval(seq, (caller_id << ` + strconv.Itoa(histWitnessBits) + `) | producer);
	END IF;
	RETURN producer;
END $f$`
	ctx := context.Background()
	for _, pool := range e.pools {
		for i := range histClients + histBurstClients {
			_, err := pool.Exec(ctx, "CREATE SEQUENCE IF NOT EXISTS "+e.witnessSeq(i))
			require.NoError(e.t, err)
		}
		_, err := pool.Exec(ctx, fn)
		require.NoError(e.t, err)
	}
}

// readWitness reads, once c returned, whether its mutation's first statement ran, and
// what record of the key it saw then, and logs it.
func (e *histEnv) readWitness(c *hcall) {
	if !c.witness {
		return
	}
	pool := e.pools[e.shardOf(c.key)]
	var v int64
	for deadline := time.Now().Add(5 * time.Second); ; { // a shard may be coming back from a crash
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := pool.QueryRow(ctx, "SELECT coalesce(pg_sequence_last_value($1::text::regclass), 0)", e.witnessSeq(c.client)).Scan(&v)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			e.event(c, "begun", fmt.Sprintf("id=%d witness unread: %v", c.id, err))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v>>histWitnessBits != c.id {
		return
	}
	c.begun, c.saw = true, v&histWitnessUnknown
	saw := "no record"
	switch c.saw {
	case histWitnessNone:
	case histWitnessUnknown:
		c.saw, saw = -1, "a record of no call"
	default:
		saw = fmt.Sprintf("call %d's record", c.saw)
	}
	e.event(c, "begun", fmt.Sprintf("id=%d the mutation's first statement ran, and saw %s", c.id, saw))
}

// histLocking reports whether c takes the key's lock to claim it: Do in every mode but
// ModeOptimistic, DoTx (whatever its mode) and DoStatement.
func histLocking(c *hcall) bool {
	return c.op == "DoTx" || c.op == "Stmt" || (c.op == "Do" && c.mode != "Optimistic")
}

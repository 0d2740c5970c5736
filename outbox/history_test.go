package outbox_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/history"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/testsuite"
)

// The dispatchers of a history run have leases and deadlines short enough that a starved
// pool, a killed process or a hung publication outlasts them many times a run.
const (
	histLease          = 1200 * time.Millisecond
	histPublishTimeout = 300 * time.Millisecond
	histMaxAttempts    = 3
	histKeys           = 6 // ordering keys in each lane
	histProducers      = 4
	histDispatchers    = 2 // in this process, per lane
	histChildren       = 1 // in child processes, per lane

	histRefusal     = "the consumer refuses the event" // a permanent failure's error
	historyChild    = "outbox-history-dispatcher"
	historyChildEnv = "ONCEKIT_OUTBOX_HISTORY_CHILD"
)

func histDispatcherConfig(ordered bool, batch int, errorFunc func(error)) *outbox.DispatcherConfig {
	return &outbox.DispatcherConfig{BatchSize: batch, PollInterval: 50 * time.Millisecond, MaxAttempts: histMaxAttempts,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, PublishTimeout: histPublishTimeout,
		Lease: histLease, AcquireTimeout: 5 * time.Second, StopGrace: time.Second, Ordered: ordered, ErrorFunc: errorFunc}
}

// TestHistoryOutbox is the outbox's history checker. Producers enqueue ordered and
// unordered events, in one Enqueue call or two (in either key order), and commit or roll
// back. Two outboxes run side by side: one with ordered dispatchers, one with unordered
// ones; in each, dispatchers in this process and in child processes run with short leases
// and deadlines behind publishers that are quick, slow, hang until their deadline, fail,
// and fail for good. An operator retries dead events. Faults SIGKILL child dispatchers,
// stop in-process ones, terminate backends (the dispatchers' and the producers') and
// starve a dispatcher's pool past its lease.
//
// Every publication stamps its start and its end from one PostgreSQL sequence, so the
// stamps of all processes share one order; at its start it also reads the event's state
// and the earlier pending events of its key. A last phase retries every dead event and
// drains both outboxes with healthy publishers. Then the history is checked: every
// committed event is published at least once and none after it is recorded published;
// one event's publications never overlap; under Ordered, a key's publications never
// overlap and start in commit order (a retried dead event takes its place anew); an
// event goes dead only after its attempts, or a permanent failure; nothing rolled back
// is ever published; a deadlock between producers is reported as
// [outbox.ErrOrderingKeyDeadlock].
func TestHistoryOutbox(t *testing.T) {
	t.Parallel()
	if pgtest.IsCitus() {
		// The checker records dispatchers' writes with a trigger whose creation the Citus
		// coordinator refuses (SQLSTATE 42601); the outbox's tables stay on the
		// coordinator, whose PostgreSQL make test and make stress check.
		t.Skip("the outbox's history checker needs its write-recording trigger, which Citus refuses to create")
	}
	run := history.Start(t, "./outbox", 25*time.Second)
	h := newHist(t, run)
	for _, lane := range h.lanes {
		for range histDispatchers {
			h.dispatchers = append(h.dispatchers, h.newDispatcher(t, lane))
		}
		for range histChildren {
			h.children = append(h.children, h.newChild(t, lane))
		}
	}
	ctx, stop := context.WithTimeout(context.Background(), run.Duration)
	defer stop()
	var wg sync.WaitGroup
	for i := range histProducers {
		wg.Go(func() { h.produce(ctx, i, run.Rand(i)) })
	}
	wg.Go(func() { h.operate(ctx, run.Rand(100)) })
	wg.Go(func() { h.inject(ctx, t, run.Rand(200)) })
	wg.Wait()
	h.faults.Wait()
	h.settle(t)
	h.check(t)
}

// hist is one history run.
type hist struct {
	seed        uint64
	rec         *pgxpool.Pool // the history's own tables; no fault touches it
	proxy       *faultproxy.Proxy
	log         *history.Log
	began       time.Time
	lanes       []*histLane
	dispatchers []*histDispatcher
	children    []*histChild
	faults      sync.WaitGroup // starvations in progress

	mu        sync.Mutex
	ticks     map[int]int64                  // log Seq to tick
	attempted map[uuid.UUID]*histLane        // every event a producer tried to enqueue
	retried   map[uuid.UUID][]int64          // the call ticks of each Retry that returned true
	unsure    map[uuid.UUID]bool             // a Retry whose outcome is unknown
	txOf      map[uuid.UUID]*histTx          // the producer's transaction of each event
	problems  []error                        // the run itself went wrong (not the outbox)
	deadlocks []history.Violation            // deadlocks not reported as ErrOrderingKeyDeadlock
	counts    map[string]int                 // operations and faults, for the summary
	gens      map[string]int                 // generation of each dispatcher slot
	errs      map[string]*atomic.Int64       // dispatcher errors by kind
	names     map[string]int                 // dispatcher name to a client number
	startSQL  map[string]string              // lane to the publication's start stamp
	laneByID  map[string]*histLane           // lane schema to lane
	dead      map[uuid.UUID]outbox.DeadEvent // dead events before the last phase
	deadTick  int64
}

// histLane is one outbox of the run, in a schema of its own.
type histLane struct {
	name    string // "ordered" or "unordered"
	schema  string
	ordered bool
	out     *outbox.Outbox // on the operator's pool
	prod    *pgxpool.Pool  // the producers' pool, whose backends faults terminate
	prodOut *outbox.Outbox
}

const histTables = `
CREATE SEQUENCE hist_tick;
CREATE TABLE hist_pubs (
	pub             uuid PRIMARY KEY,
	lane            text NOT NULL,
	event_id        uuid NOT NULL,
	dispatcher      text NOT NULL,
	nth             bigint NOT NULL,
	seen_state      text,
	earlier_pending uuid[] NOT NULL,
	start_tick      bigint NOT NULL,
	start_at        timestamptz NOT NULL,
	end_tick        bigint,
	end_at          timestamptz,
	outcome         text,
	overran         bool NOT NULL DEFAULT false,
	late_start      bool NOT NULL DEFAULT false
);
CREATE INDEX hist_pubs_event_idx ON hist_pubs (event_id);
CREATE INDEX hist_pubs_open_idx ON hist_pubs (dispatcher) WHERE end_tick IS NULL;
CREATE TABLE hist_writes (
	tick      bigint NOT NULL,
	lane      text NOT NULL,
	event_id  uuid NOT NULL,
	app       text NOT NULL,
	old_by    uuid,
	new_by    uuid,
	old_state text NOT NULL,
	new_state text NOT NULL
)`

// histWriteTrigger records every change a dispatcher makes to an event, in the
// transaction that makes it, with the dispatcher's application name: a claim sets a
// new owner token, and every other write must be by the dispatcher that set the token
// it finds. $1 is the recorder's schema, quoted; $2 the lane's.
func histWriteTrigger(rec, lane string) string {
	return `CREATE OR REPLACE FUNCTION ` + rec + `.hist_write() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
	IF current_setting('application_name') LIKE 'histd-%' THEN
		INSERT INTO ` + rec + `.hist_writes VALUES (nextval('` + rec + `.hist_tick'), TG_TABLE_SCHEMA, NEW.id,
			current_setting('application_name'), OLD.locked_by, NEW.locked_by, OLD.state, NEW.state);
	END IF;
	RETURN NEW;
END $f$;
CREATE TRIGGER hist_write AFTER UPDATE ON ` + lane + `.outbox_events FOR EACH ROW EXECUTE FUNCTION ` + rec + `.hist_write()`
}

// histStartSQL stamps the start of a publication: $1 publication, $2 event, $3 lane, $4
// dispatcher. In the same snapshot it reads the event's state and the pending events of
// its key that come before it, and counts the event's earlier publications.
func histStartSQL(lane string) string {
	t := pgx.Identifier{lane, "outbox_events"}.Sanitize()
	return `WITH e AS (SELECT state, seq, ordering_key FROM ` + t + ` WHERE id = $2)
		INSERT INTO hist_pubs (pub, lane, event_id, dispatcher, nth, seen_state, earlier_pending, start_tick, start_at)
		SELECT $1, $3, $2, $4, (SELECT count(*) FROM hist_pubs h WHERE h.event_id = $2), (SELECT state FROM e),
			ARRAY(SELECT p.id FROM ` + t + ` p JOIN e ON p.ordering_key = e.ordering_key WHERE p.state = 'pending' AND p.seq < e.seq),
			nextval('hist_tick'), clock_timestamp()
		RETURNING nth`
}

const histEndSQL = `UPDATE hist_pubs SET end_tick = nextval('hist_tick'), end_at = clock_timestamp(), outcome = $2 WHERE pub = $1`

func newHist(t *testing.T, run history.Run) *hist {
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := pool.Exec(ctx, histTables)
	require.NoError(t, err)
	h := &hist{seed: run.Seed, log: history.NewLog(), began: time.Now(),
		ticks: map[int]int64{}, attempted: map[uuid.UUID]*histLane{}, retried: map[uuid.UUID][]int64{},
		unsure: map[uuid.UUID]bool{}, txOf: map[uuid.UUID]*histTx{}, counts: map[string]int{}, gens: map[string]int{}, errs: map[string]*atomic.Int64{},
		names: map[string]int{}, startSQL: map[string]string{}, laneByID: map[string]*histLane{}}
	h.proxy = newHistProxy(t, h)
	h.rec = pgtest.Pool(t, schema, func(c *pgxpool.Config) {
		c.MaxConns = 12
		c.ConnConfig.RuntimeParams["application_name"] = "histrec-parent"
	})
	for _, mode := range []string{"ordered", "unordered"} {
		lane := &histLane{name: mode, schema: schema + "_" + mode[:1], ordered: mode == "ordered"}
		_, err := migrate.Up(ctx, pool, lane.schema)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{lane.schema}.Sanitize()+" CASCADE")
		})
		op := pgtest.Pool(t, lane.schema, func(c *pgxpool.Config) {
			c.MaxConns = 4
			c.ConnConfig.RuntimeParams["application_name"] = "histop-" + mode
		})
		lane.prod = pgtest.Pool(t, lane.schema, func(c *pgxpool.Config) {
			h.proxy.Route(&c.ConnConfig.Config)
			c.MaxConns = histProducers
			c.ConnConfig.RuntimeParams["application_name"] = "histp-" + mode
		})
		lane.out, err = outbox.New(op, &outbox.Config{Schema: lane.schema})
		require.NoError(t, err)
		lane.prodOut, err = outbox.New(lane.prod, &outbox.Config{Schema: lane.schema})
		require.NoError(t, err)
		_, err = pool.Exec(ctx, histWriteTrigger(pgx.Identifier{schema}.Sanitize(), pgx.Identifier{lane.schema}.Sanitize()))
		require.NoError(t, err)
		h.lanes = append(h.lanes, lane)
		h.startSQL[lane.schema] = histStartSQL(lane.schema)
		h.laneByID[lane.schema] = lane
	}
	return h
}

// newHistProxy is the fault proxy of the producers' and the in-process dispatchers'
// connections: cuts, delays and half-closes, and commits (a producer's COMMIT, a
// dispatcher's claim or record, each a transaction of its own) whose answer is lost or
// replaced by a FATAL after the server ran them.
func newHistProxy(t *testing.T, h *hist) *faultproxy.Proxy {
	return faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{Seed: h.seed, Cut: 0.002, CutAnswer: 0.001, HalfClose: 0.001,
		Delay: 0.02, CommitLost: 0.02, CommitFatal: 0.02, SyncLost: 0.005, SyncFatal: 0.005,
		FaultFunc: func(kind string, conn int, detail string) {
			if kind == faultproxy.CommitLost || kind == faultproxy.CommitFatal {
				h.record(history.Event{Kind: "fault", Op: "tcp " + kind, Key: "-", Detail: fmt.Sprintf("conn %d %s", conn, detail)})
			}
		}})
}

// histTx is a producer's transaction and what its client was told of it.
type histTx struct {
	outcome string // "committed", "rolled back" or "unknown"
	err     error
}

// record adds e to the log with a tick from the history's sequence, and returns the tick.
func (h *hist) record(e history.Event) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tick int64
	if err := h.rec.QueryRow(ctx, `SELECT nextval('hist_tick')`).Scan(&tick); err != nil {
		h.problem(fmt.Errorf("take a tick: %w", err))
	}
	seq := h.log.Add(e)
	h.mu.Lock()
	h.ticks[seq] = tick
	h.mu.Unlock()
	return tick
}

func (h *hist) problem(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.problems = append(h.problems, err)
}

func (h *hist) count(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[what]++
}

func (h *hist) client(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.names[name]
	if !ok {
		n = 10 + len(h.names)
		h.names[name] = n
	}
	return n
}

// next names the next dispatcher of a slot.
func (h *hist) next(slot string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gens[slot]++
	return fmt.Sprintf("%s.%d", slot, h.gens[slot])
}

// errorFunc counts a dispatcher's errors by kind.
func (h *hist) errorFunc(err error) {
	kind := "other"
	switch {
	case errors.Is(err, outbox.ErrLeaseLost):
		kind = "lease lost"
	case strings.Contains(err.Error(), "no pool connection"):
		kind = "no connection"
	case strings.Contains(err.Error(), "publish "):
		kind = "publication failed"
	}
	h.mu.Lock()
	c, ok := h.errs[kind]
	if !ok {
		c = &atomic.Int64{}
		h.errs[kind] = c
	}
	h.mu.Unlock()
	c.Add(1)
}

// histPublisher publishes nothing: it stamps each publication's start and end, and
// behaves as the seed and the count of the event's earlier publications say.
type histPublisher struct {
	rec        *pgxpool.Pool
	lane       string
	startSQL   string
	dispatcher string
	seed       uint64
	healthy    bool        // the last phase: every publication succeeds at once
	fail       func(error) // a stamp could not be written: the history would be incomplete
	// starve, when set, starves the publisher's own dispatcher's pool past its lease
	// from inside a publication: the dispatcher learns of it only at its next write.
	starve func(r *rand.Rand)
	// slowUntil (Unix nanoseconds) is when the slow publications that follow a
	// starvation from inside the publisher end: the batch then outlasts its lease's
	// margin while the pool is starved, and its renewal comes after another claimed it.
	slowUntil atomic.Int64
}

func (p *histPublisher) Publish(ctx context.Context, e outbox.Event) error {
	pub := uuid.New()
	var nth int64
	if err := stamp(func(ctx context.Context) error {
		return p.rec.QueryRow(ctx, p.startSQL, pub, e.ID, p.lane, p.dispatcher).Scan(&nth)
	}); err != nil {
		p.fail(fmt.Errorf("stamp the start of a publication of %s: %w", e.ID, err))
		return err
	}
	// The stamp's snapshot stands for the publication's start only if it was taken while
	// the dispatcher's lease lasted: a publication starts with PublishTimeout and a
	// quarter of the lease left, so the lease lasts past the deadline by that quarter.
	// A stamp that returned later (a loaded machine) may have read the event after
	// another dispatcher claimed and published it; it is marked, and "published only
	// while pending" leaves it out.
	p.markPast(ctx, histLease/4, pub, "late_start", "mark the start of a publication of %s as late: %w", e.ID)
	var outcome string
	var err error
	if time.Now().UnixNano() < p.slowUntil.Load() {
		outcome, err = slowly(ctx, histPublishTimeout*4/5)
	} else {
		outcome, err = p.behave(ctx, e, nth)
	}
	if p.starve != nil && !p.healthy {
		r := rand.New(rand.NewPCG(p.seed^0x5bd1e995, binary.LittleEndian.Uint64(e.ID[:8])+uint64(nth)))
		if r.IntN(25) == 0 {
			p.slowUntil.Store(time.Now().Add(histLease).UnixNano())
			p.starve(r)
		}
	}
	if serr := stamp(func(ctx context.Context) error {
		_, err := p.rec.Exec(ctx, histEndSQL, pub, outcome)
		return err
	}); serr != nil {
		p.fail(fmt.Errorf("stamp the end of a publication of %s: %w", e.ID, serr))
	}
	// behave honours its context, but the stamp above, a statement of its own, may not
	// return within the dispatcher's grace on a loaded machine: the dispatcher has then
	// abandoned this publication, as it abandons any publisher that outlives its deadline,
	// and the next of the event or its key may have started. Such a publication is marked,
	// and the checks of overlapping publications leave it out.
	p.markPast(ctx, histLease/8, pub, "overran", "mark the publication of %s as overrun: %w", e.ID)
	return err
}

// markPast sets the publication's flag column when more than after has passed since
// ctx's deadline; failing, a format, says what failed, with the event's ID and the error.
func (p *histPublisher) markPast(ctx context.Context, after time.Duration, pub uuid.UUID, flag, failing string, event uuid.UUID) {
	dl, ok := ctx.Deadline()
	if !ok || !time.Now().After(dl.Add(after)) {
		return
	}
	if err := stamp(func(ctx context.Context) error {
		_, err := p.rec.Exec(ctx, `UPDATE hist_pubs SET `+flag+` = true WHERE pub = $1`, pub)
		return err
	}); err != nil {
		p.fail(fmt.Errorf(failing, event, err))
	}
}

// slowly is a publication that succeeds after d, or is cut by its context.
func slowly(ctx context.Context, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return "ok", nil
	case <-ctx.Done():
		return "cut", ctx.Err()
	}
}

// stamp writes to the history's tables within a bound of its own: a stamp outlives the
// publication's context.
func stamp(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f(ctx)
}

// behave is the consumer: quick, slow, near the deadline, failing, failing for good, or
// hanging until the deadline. It honours its context.
func (p *histPublisher) behave(ctx context.Context, e outbox.Event, nth int64) (string, error) {
	if p.healthy {
		return "ok", nil
	}
	r := rand.New(rand.NewPCG(p.seed, binary.LittleEndian.Uint64(e.ID[8:])+uint64(nth)*0x9e3779b97f4a7c15))
	wait := func(d time.Duration) (string, error) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return "ok", nil
		case <-ctx.Done():
			return "cut", ctx.Err()
		}
	}
	switch x := r.Float64(); {
	case x < 0.70:
		return wait(time.Duration(r.IntN(3)) * time.Millisecond)
	case x < 0.78:
		return wait(time.Duration(30+r.IntN(120)) * time.Millisecond)
	case x < 0.86:
		return "fail", errors.New("history: the consumer is unavailable")
	case x < 0.90:
		<-ctx.Done()
		return "hang", ctx.Err()
	case x < 0.93:
		return "permanent", fmt.Errorf("history: %s: %w", histRefusal, outbox.ErrPermanent)
	default:
		return wait(histPublishTimeout * time.Duration(50+r.IntN(45)) / 100)
	}
}

// histDispatcher is a slot for a dispatcher in this process, on a pool of its own that
// faults starve; a restart puts a new dispatcher on the same pool.
type histDispatcher struct {
	slot     string
	lane     *histLane
	pool     *pgxpool.Pool
	batch    int
	healthy  bool
	starving atomic.Bool
	name     string
	cancel   context.CancelFunc
	done     chan struct{}
}

func (h *hist) newDispatcher(t *testing.T, lane *histLane) *histDispatcher {
	return h.newDispatcherIn(t, lane, "d", false)
}

func (h *hist) newDispatcherIn(t *testing.T, lane *histLane, prefix string, healthy bool) *histDispatcher {
	h.mu.Lock()
	slot := fmt.Sprintf("%s/%s%d", lane.name, prefix, len(h.gens))
	h.gens[slot] = 0
	h.mu.Unlock()
	d := &histDispatcher{slot: slot, lane: lane, healthy: healthy, batch: 1 + int(h.seed%7)*3}
	if lane.ordered {
		d.batch = max(d.batch, 4) // batches with several events of a key
	}
	d.pool = pgtest.Pool(t, lane.schema, func(c *pgxpool.Config) {
		h.proxy.Route(&c.ConnConfig.Config)
		c.MaxConns = 2
		c.ConnConfig.RuntimeParams["application_name"] = "histd-" + slot
	})
	h.start(t, d)
	return d
}

func (h *hist) start(t *testing.T, d *histDispatcher) {
	d.name = h.next(d.slot)
	// The publisher's goroutines name this run of the dispatcher by name, not by d.name,
	// which the next restart rewrites while they may still run.
	name := d.name
	out, err := outbox.New(d.pool, &outbox.Config{Schema: d.lane.schema})
	if err != nil {
		h.problem(err)
		return
	}
	pub := &histPublisher{rec: h.rec, lane: d.lane.schema, startSQL: h.startSQL[d.lane.schema], dispatcher: d.name,
		seed: h.seed, healthy: d.healthy, fail: h.problem, starve: func(r *rand.Rand) {
			// Well past the lease, so that another dispatcher claims the rest of the batch
			// before this one's next write.
			h.starveFor(d, name, 3*histLease/2+time.Duration(r.Int64N(int64(histLease))), "from its publisher")
		}}
	dd, err := outbox.NewDispatcher(out, pub, histDispatcherConfig(d.lane.ordered, d.batch, h.errorFunc))
	if err != nil {
		h.problem(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel, d.done = cancel, make(chan struct{})
	go func() {
		defer close(d.done)
		if err := dd.Run(ctx); !errors.Is(err, context.Canceled) {
			h.problem(fmt.Errorf("dispatcher %s: Run returned %w", name, err))
		}
	}()
	t.Cleanup(d.stop)
}

// stop stops the slot's dispatcher as a deployment would, and waits for it.
func (d *histDispatcher) stop() {
	if d.cancel != nil {
		d.cancel()
		<-d.done
	}
}

// histChild is a slot for a dispatcher in a child process, which faults SIGKILL.
type histChild struct {
	slot string
	lane *histLane
	name string
	proc *testsuite.WorkerProcess
}

// histChildConfig is what a child process is told, through its environment.
type histChildConfig struct {
	Lane, Recorder, Name string
	Ordered              bool
	Seed                 uint64
	Batch                int
}

func (h *hist) newChild(t *testing.T, lane *histLane) *histChild {
	h.mu.Lock()
	slot := fmt.Sprintf("%s/c%d", lane.name, len(h.gens))
	h.gens[slot] = 0
	h.mu.Unlock()
	c := &histChild{slot: slot, lane: lane}
	h.startChild(t, c)
	return c
}

func (h *hist) startChild(t *testing.T, c *histChild) {
	c.name = h.next(c.slot)
	cfg, _ := json.Marshal(histChildConfig{Lane: c.lane.schema, Recorder: h.rec.Config().ConnConfig.RuntimeParams["search_path"],
		Name: c.name, Ordered: c.lane.ordered, Seed: h.seed, Batch: 2 + int(h.seed%5)*4})
	c.proc = testsuite.StartWorkerProcess(t, historyChild, map[string]string{historyChildEnv: string(cfg)})
}

// runHistoryChild is a child process's dispatcher: it runs until it is killed.
func runHistoryChild(ctx context.Context) error {
	var c histChildConfig
	if err := json.Unmarshal([]byte(os.Getenv(historyChildEnv)), &c); err != nil {
		return err
	}
	open := func(schema, app string) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 2
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	pool, err := open(c.Lane, "histd-"+c.Name)
	if err != nil {
		return err
	}
	rec, err := open(c.Recorder, "histrec-"+c.Name)
	if err != nil {
		return err
	}
	out, err := outbox.New(pool, &outbox.Config{Schema: c.Lane})
	if err != nil {
		return err
	}
	pub := &histPublisher{rec: rec, lane: c.Lane, startSQL: histStartSQL(c.Lane), dispatcher: c.Name, seed: c.Seed,
		fail: func(err error) {
			fmt.Fprintf(os.Stderr, "history dispatcher %s: %v\n", c.Name, err)
			os.Exit(3)
		}}
	d, err := outbox.NewDispatcher(out, pub, histDispatcherConfig(c.Ordered, c.Batch, nil))
	if err != nil {
		return err
	}
	if err := d.Run(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// kill SIGKILLs the child and closes its open publications once its backends are gone:
// a statement it sent before it died has then committed or rolled back.
func (h *hist) kill(c *histChild) {
	h.record(history.Event{Client: h.client(c.name), Kind: "fault", Op: "SIGKILL", Key: "-", Detail: c.name})
	if !c.proc.Kill() {
		h.problem(fmt.Errorf("child dispatcher %s exited by itself (see its output above)", c.name))
	}
	h.count("fault: dispatcher process SIGKILLed")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var n int
		err := h.rec.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name IN ($1, $2)`,
			"histd-"+c.name, "histrec-"+c.name).Scan(&n)
		if err != nil {
			h.problem(fmt.Errorf("wait for the backends of %s to go: %w", c.name, err))
			return
		}
		if n == 0 {
			break
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			h.problem(fmt.Errorf("the backends of %s outlived it by 30s", c.name))
			return
		}
	}
	if _, err := h.rec.Exec(ctx, `UPDATE hist_pubs SET end_tick = nextval('hist_tick'), end_at = clock_timestamp(), outcome = 'killed'
		WHERE dispatcher = $1 AND end_tick IS NULL`, c.name); err != nil {
		h.problem(fmt.Errorf("close the publications of %s: %w", c.name, err))
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// histID is an event ID drawn from r, so that a seed's plan names the same events.
func histID(r *rand.Rand) uuid.UUID {
	var id uuid.UUID
	binary.LittleEndian.PutUint64(id[:8], r.Uint64())
	binary.LittleEndian.PutUint64(id[8:], r.Uint64())
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

func short(id uuid.UUID) string { return id.String()[:8] }

// produce enqueues events in transactions that commit or roll back, until ctx is done.
func (h *hist) produce(ctx context.Context, i int, r *rand.Rand) {
	for ctx.Err() == nil {
		lane := h.lanes[r.IntN(len(h.lanes))]
		n := 1 + r.IntN(3)
		if r.IntN(8) == 0 {
			n = 6 + r.IntN(7) // a burst: the dispatchers' batches hold several events, of a key too
		}
		events := make([]outbox.Event, n)
		var desc []string
		for j := range events {
			events[j] = outbox.Event{ID: histID(r), Topic: "history", Payload: []byte(fmt.Sprintf(`{"producer":%d}`, i))}
			if r.IntN(4) != 0 {
				events[j].OrderingKey = fmt.Sprintf("k%d", r.IntN(histKeys))
			}
			desc = append(desc, short(events[j].ID)+"/"+cmpOr(events[j].OrderingKey, "-"))
		}
		calls := [][]outbox.Event{events}
		if len(events) > 1 && r.IntN(4) == 0 {
			// Two Enqueue calls, on keys k0 and k1 in either order: two such producers
			// can wait for each other's key.
			cut := 1 + r.IntN(len(events)-1)
			first := r.IntN(2)
			for j := range events {
				events[j].OrderingKey = fmt.Sprintf("k%d", first)
				if j >= cut {
					events[j].OrderingKey = fmt.Sprintf("k%d", 1-first)
				}
				desc[j] = short(events[j].ID) + "/" + events[j].OrderingKey
			}
			calls = [][]outbox.Event{events[:cut], events[cut:]}
		}
		h.transact(ctx, i, lane, calls, r.IntN(10) == 0, strings.Join(desc, " "))
		sleepCtx(ctx, time.Duration(5+r.IntN(30))*time.Millisecond)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (h *hist) transact(ctx context.Context, i int, lane *histLane, calls [][]outbox.Event, rollback bool, desc string) {
	htx := &histTx{outcome: "rolled back"}
	h.mu.Lock()
	for _, c := range calls {
		for _, e := range c {
			h.attempted[e.ID] = lane
			h.txOf[e.ID] = htx
		}
	}
	h.mu.Unlock()
	h.count("transactions")
	h.record(history.Event{Client: i, Kind: "call", Op: "Enqueue", Key: short(calls[0][0].ID), Detail: lane.name + " " + desc})
	end := func(what string) {
		h.record(history.Event{Client: i, Kind: "return", Op: "Enqueue", Key: short(calls[0][0].ID), Detail: what})
	}
	tx, err := lane.prod.Begin(ctx)
	if err != nil {
		end("begin: " + err.Error())
		return
	}
	cleanup := context.WithoutCancel(ctx)
	for n, c := range calls {
		if n > 0 {
			// The business work between the two calls.
			if _, err = tx.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
				break
			}
		}
		if _, err = lane.prodOut.Enqueue(ctx, tx, c...); err != nil {
			break
		}
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			h.count("deadlocks between producers")
			if !errors.Is(err, outbox.ErrOrderingKeyDeadlock) {
				h.mu.Lock()
				h.deadlocks = append(h.deadlocks, history.Violation{Check: "deadlock is typed", Key: short(calls[0][0].ID),
					What: fmt.Sprintf("Enqueue returned a deadlock that is not ErrOrderingKeyDeadlock: %v", err)})
				h.mu.Unlock()
			}
		}
		_ = tx.Rollback(cleanup)
		end("rolled back: " + err.Error())
		return
	}
	if rollback {
		_ = tx.Rollback(cleanup)
		end("rolled back")
		return
	}
	if err := tx.Commit(ctx); err != nil {
		h.mu.Lock()
		htx.err = err
		if pgsql.CommitUnknown(err) {
			htx.outcome = "unknown"
		}
		h.mu.Unlock()
		end(fmt.Sprintf("commit: %s: %v", htx.outcome, err))
		return
	}
	h.mu.Lock()
	htx.outcome = "committed"
	h.mu.Unlock()
	h.count("transactions committed")
	end("committed")
}

// operate retries some dead events now and then.
func (h *hist) operate(ctx context.Context, r *rand.Rand) {
	for sleepCtx(ctx, time.Duration(200+r.IntN(400))*time.Millisecond) {
		for _, lane := range h.lanes {
			dead, err := lane.out.Dead(ctx, 20)
			if err != nil {
				continue
			}
			for _, d := range dead {
				if r.IntN(2) == 0 {
					h.retry(ctx, lane, d.ID, 1)
				}
			}
		}
	}
}

func (h *hist) retry(ctx context.Context, lane *histLane, id uuid.UUID, client int) {
	// The call's tick, not the return's, bounds the publications after the retry: a
	// dispatcher may take the event up between the retry's commit and its answer.
	called := h.record(history.Event{Client: client, Kind: "call", Op: "Retry", Key: short(id), Detail: lane.name})
	ok, err := lane.out.Retry(ctx, id)
	h.record(history.Event{Client: client, Kind: "return", Op: "Retry", Key: short(id), Detail: fmt.Sprintf("retried=%v err=%v", ok, err)})
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil:
		h.unsure[id] = true
	case ok:
		h.retried[id] = append(h.retried[id], called)
		h.counts["retries of dead events"]++
	}
}

// inject injects a fault now and then: a backend terminated, a pool starved, a child
// process SIGKILLed, a dispatcher stopped and started again.
func (h *hist) inject(ctx context.Context, t *testing.T, r *rand.Rand) {
	locker := pgtest.Pool(t, ordered(h.lanes).schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		c.ConnConfig.RuntimeParams["application_name"] = "histlock"
	})
	lr := rand.New(rand.NewPCG(h.seed, 300))
	wg := sync.WaitGroup{}
	wg.Go(func() {
		for sleepCtx(ctx, time.Duration(50+lr.IntN(200))*time.Millisecond) {
			h.lockHead(ctx, lr, locker)
		}
	})
	defer wg.Wait()
	for sleepCtx(ctx, time.Duration(150+r.IntN(350))*time.Millisecond) {
		switch x := r.IntN(10); {
		case x < 3:
			h.terminate(ctx, r, "histd-%", "fault: dispatcher backend terminated")
		case x < 5:
			h.starve(ctx, r)
		case x < 7:
			c := h.children[r.IntN(len(h.children))]
			h.kill(c)
			h.startChild(t, c)
		case x < 8:
			d := h.dispatchers[r.IntN(len(h.dispatchers))]
			h.record(history.Event{Client: h.client(d.name), Kind: "fault", Op: "stop", Key: "-", Detail: d.name})
			d.stop()
			h.count("fault: dispatcher stopped and started again")
			h.start(t, d)
		case x < 9:
			h.terminate(ctx, r, "histp-%", "fault: producer backend terminated")
		}
	}
}

func (h *hist) terminate(ctx context.Context, r *rand.Rand, pattern, what string) {
	rows, err := h.rec.Query(ctx, `SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE $1 ORDER BY pid`, pattern)
	if err != nil {
		return
	}
	type backend struct {
		pid int32
		app string
	}
	backends, err := pgx.CollectRows(rows, pgx.RowToStructByPos[backend])
	if err != nil || len(backends) == 0 {
		return
	}
	b := backends[r.IntN(len(backends))]
	h.record(history.Event{Kind: "fault", Op: "terminate", Key: "-", Detail: b.app})
	if _, err := h.rec.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, b.pid); err == nil {
		h.count(what)
	}
}

// starve takes every connection of a dispatcher's pool for up to three leases.
func (h *hist) starve(ctx context.Context, r *rand.Rand) {
	d := h.dispatchers[r.IntN(len(h.dispatchers))]
	h.starveFor(d, d.name, histLease/2+time.Duration(r.Int64N(int64(5*histLease/2))), "")
}

// starveFor takes every connection of d's pool for hold. From inside d's publisher
// (why names it) it returns once the connections are taken, so that d's next write
// waits for them: by then another dispatcher may have claimed the batch.
func (h *hist) starveFor(d *histDispatcher, name string, hold time.Duration, why string) {
	if !d.starving.CompareAndSwap(false, true) {
		return
	}
	taken := make(chan struct{})
	h.faults.Go(func() {
		defer d.starving.Store(false)
		h.record(history.Event{Client: h.client(name), Kind: "fault", Op: "starve", Key: "-", Detail: fmt.Sprintf("%s for %s %s", d.slot, hold, why)})
		if why == "" {
			h.count("fault: dispatcher pool starved")
		} else {
			h.count("fault: dispatcher pool starved " + why)
		}
		hctx, cancel := context.WithTimeout(context.Background(), hold)
		defer cancel()
		var held []*pgxpool.Conn
		for range d.pool.Config().MaxConns {
			c, err := d.pool.Acquire(hctx)
			if err != nil {
				break
			}
			held = append(held, c)
		}
		close(taken)
		<-hctx.Done()
		for _, c := range held {
			c.Release()
		}
		h.record(history.Event{Client: h.client(name), Kind: "fault", Op: "starve-end", Key: "-", Detail: d.slot})
	})
	if why != "" {
		<-taken
	}
}

// lockHead holds the row of the first pending event of an ordered key that has later
// pending events locked for a while, as a dispatcher recording its outcome slowly does:
// a claim skips the row, and must not take the events behind it.
func (h *hist) lockHead(ctx context.Context, r *rand.Rand, pool *pgxpool.Pool) {
	hold := time.Duration(50+r.IntN(400)) * time.Millisecond
	h.faults.Go(func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		var id uuid.UUID
		var key string
		err = tx.QueryRow(ctx, `SELECT id, ordering_key FROM outbox_events e WHERE state = 'pending' AND ordering_key IS NOT NULL
			AND EXISTS (SELECT 1 FROM outbox_events l WHERE l.ordering_key = e.ordering_key AND l.state = 'pending' AND l.seq > e.seq)
			AND NOT EXISTS (SELECT 1 FROM outbox_events p WHERE p.ordering_key = e.ordering_key AND p.state = 'pending' AND p.seq < e.seq)
			ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id, &key)
		if err != nil {
			return
		}
		h.record(history.Event{Kind: "fault", Op: "lock-row", Key: short(id), Detail: fmt.Sprintf("key %s for %s", key, hold)})
		h.count("fault: head of an ordered key held locked")
		sleepCtx(ctx, hold)
	})
}

// settle is the last phase: the faults stop, every dead event is retried, and healthy
// dispatchers drain both outboxes.
func (h *hist) settle(t *testing.T) {
	h.proxy.SetEnabled(false)
	for _, c := range h.children {
		h.kill(c)
	}
	for _, d := range h.dispatchers {
		d.stop()
	}
	ctx := context.Background()
	h.dead = map[uuid.UUID]outbox.DeadEvent{}
	h.deadTick = h.record(history.Event{Kind: "fault", Op: "settle", Key: "-", Detail: "the faults stop"})
	for _, lane := range h.lanes {
		dead, err := lane.out.Dead(ctx, 1_000_000)
		require.NoError(t, err)
		for _, d := range dead {
			h.dead[d.ID] = d
		}
	}
	var final []*histDispatcher
	for _, lane := range h.lanes {
		for range 2 {
			final = append(final, h.newDispatcherIn(t, lane, "final", true))
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		left := 0
		for _, lane := range h.lanes {
			dead, err := lane.out.Dead(ctx, 1000)
			require.NoError(t, err)
			for _, d := range dead {
				h.retry(ctx, lane, d.ID, 2)
			}
			st, err := lane.out.Stats(ctx)
			require.NoError(t, err)
			left += st.Pending + st.Dead
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("history: %d events still pending or dead two minutes after the faults stopped", left)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, d := range final {
		d.stop()
	}
}

// histPub is one publication, as stamped.
type histPub struct {
	pub            uuid.UUID
	lane           string
	event          uuid.UUID
	dispatcher     string
	nth            int64
	seen           string
	earlier        []uuid.UUID
	start, end     int64 // end is MaxInt64 for a publication that never ended
	startAt, endAt time.Time
	outcome        string
	overran        bool // returned after the dispatcher's deadline and grace: abandoned
	lateStart      bool // its start stamped after its lease could have run out: see Publish
}

// histRow is an event as the outbox holds it at the end.
type histRow struct {
	lane      *histLane
	key       string
	state     string
	attempts  int
	lastError string
}

func (h *hist) check(t *testing.T) {
	ctx := context.Background()
	rows, err := h.rec.Query(ctx, `SELECT pub, lane, event_id, dispatcher, nth, coalesce(seen_state, ''), earlier_pending,
		start_tick, coalesce(end_tick, 9223372036854775807), start_at, coalesce(end_at, start_at), coalesce(outcome, ''), overran, late_start
		FROM hist_pubs ORDER BY start_tick`)
	require.NoError(t, err)
	pubs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*histPub, error) {
		p := &histPub{}
		err := r.Scan(&p.pub, &p.lane, &p.event, &p.dispatcher, &p.nth, &p.seen, &p.earlier, &p.start, &p.end, &p.startAt, &p.endAt, &p.outcome, &p.overran, &p.lateStart)
		return p, err
	})
	require.NoError(t, err)
	committed := map[uuid.UUID]histRow{}
	for _, lane := range h.lanes {
		rows, err := h.rec.Query(ctx, `SELECT id, coalesce(ordering_key, ''), state, attempts, coalesce(last_error, '')
			FROM `+pgx.Identifier{lane.schema, "outbox_events"}.Sanitize())
		require.NoError(t, err)
		for rows.Next() {
			var id uuid.UUID
			row := histRow{lane: lane}
			require.NoError(t, rows.Scan(&id, &row.key, &row.state, &row.attempts, &row.lastError))
			committed[id] = row
		}
		require.NoError(t, rows.Err())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, err := range h.problems {
		t.Errorf("history: the run itself went wrong: %v", err)
	}

	timeline := h.timeline(pubs, committed)
	evidence := func(ids ...uuid.UUID) []history.Event {
		want := map[string]bool{}
		for _, id := range ids {
			want[short(id)] = true
		}
		// The events' own entries, and the faults among them.
		first, last := -1, -1
		for i, e := range timeline {
			if want[e.Key] {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		var out []history.Event
		for i := max(first, 0); i <= last; i++ {
			if e := timeline[i]; want[e.Key] || e.Kind == "fault" {
				out = append(out, e)
			}
		}
		return out
	}
	keyEvidence := func(lane *histLane, key string) []history.Event {
		var ids []uuid.UUID
		for id, row := range committed {
			if row.lane == lane && row.key == key {
				ids = append(ids, id)
			}
		}
		return evidence(ids...)
	}

	var vs []history.Violation
	byEvent := map[uuid.UUID][]*histPub{}
	for _, p := range pubs {
		byEvent[p.event] = append(byEvent[p.event], p)
	}
	okBefore := func(id uuid.UUID, tick int64) bool {
		for _, p := range byEvent[id] {
			if p.outcome == "ok" && p.end < tick {
				return true
			}
		}
		return false
	}

	// Nothing rolled back is ever published; every committed event is published at
	// least once, and ends recorded as published.
	for id := range h.attempted {
		if _, ok := committed[id]; !ok && len(byEvent[id]) > 0 {
			vs = append(vs, history.Violation{Check: "nothing rolled back is published", Key: short(id),
				What: "an event whose transaction rolled back was published", Events: evidence(id)})
		}
	}
	// A producer's transaction committed exactly when its client was told so, or told
	// the outcome is unknown.
	for id, tx := range h.txOf {
		_, ok := committed[id]
		switch {
		case ok && tx.outcome == "rolled back":
			vs = append(vs, history.Violation{Check: "a plain error means nothing committed", Key: short(id),
				What: fmt.Sprintf("the event is in the outbox, yet its transaction said it rolled back (%v)", tx.err), Events: evidence(id)})
		case !ok && tx.outcome == "committed":
			vs = append(vs, history.Violation{Check: "a committed transaction's events are in the outbox", Key: short(id),
				What: "the event's transaction committed, and the event is not in the outbox", Events: evidence(id)})
		}
	}
	for id, row := range committed {
		if !okBefore(id, math.MaxInt64) || row.state != "published" {
			vs = append(vs, history.Violation{Check: "every committed event is published", Key: short(id),
				What:   fmt.Sprintf("the event is %s after the last phase, with no successful publication recorded as such", row.state),
				Events: evidence(id)})
		}
	}
	for _, p := range pubs {
		// None after it is recorded published (or dead).
		if p.seen != "pending" && !p.lateStart {
			vs = append(vs, history.Violation{Check: "published only while pending", Key: short(p.event),
				What:   fmt.Sprintf("%s started a publication of an event that was %q", p.dispatcher, cmpOr(p.seen, "absent")),
				Events: evidence(p.event)})
		}
		if p.end == math.MaxInt64 {
			vs = append(vs, history.Violation{Check: "publications end", Key: short(p.event),
				What: fmt.Sprintf("a publication by %s never ended", p.dispatcher), Events: evidence(p.event)})
		}
	}
	// One event's publications never overlap.
	for id, ps := range byEvent {
		if a, b := overlap(ps); a != nil {
			vs = append(vs, history.Violation{Check: "one publication of an event at a time", Key: short(id),
				What: fmt.Sprintf("%s started a publication while %s's was in flight", b.dispatcher, a.dispatcher), Events: evidence(id)})
		}
	}
	// Under Ordered, a key's publications never overlap and start in commit order.
	byKey := map[string][]*histPub{}
	for _, p := range pubs {
		row, ok := committed[p.event]
		if !ok || !row.lane.ordered || row.key == "" {
			continue
		}
		byKey[row.key] = append(byKey[row.key], p)
		if p.lateStart {
			continue // its earlier events were read after its start: see Publish
		}
		for _, x := range p.earlier {
			if !okBefore(x, p.start) {
				vs = append(vs, history.Violation{Check: "ordered: a key's publications start in commit order", Key: row.key,
					What: fmt.Sprintf("%s started %s while the earlier event %s of its key was pending and not published",
						p.dispatcher, short(p.event), short(x)), Events: evidence(p.event, x)})
			}
		}
	}
	for key, ps := range byKey {
		if a, b := overlap(ps); a != nil {
			vs = append(vs, history.Violation{Check: "ordered: one publication of a key at a time", Key: key,
				What: fmt.Sprintf("%s started %s while %s's publication of %s was in flight", b.dispatcher, short(b.event),
					a.dispatcher, short(a.event)), Events: keyEvidence(ordered(h.lanes), key)})
		}
	}
	// An event goes dead only after its attempts, or a permanent failure.
	for id, d := range h.dead {
		if h.unsure[id] {
			continue
		}
		var since int64
		for _, tick := range h.retried[id] {
			if tick < h.deadTick {
				since = max(since, tick)
			}
		}
		failures := 0
		for _, p := range byEvent[id] {
			if p.start > since && p.end < h.deadTick && p.outcome != "ok" {
				failures++
			}
		}
		permanent := strings.Contains(d.LastError, histRefusal)
		if failures < d.Attempts || (!permanent && d.Attempts < histMaxAttempts) {
			vs = append(vs, history.Violation{Check: "dead only after its attempts", Key: short(id),
				What: fmt.Sprintf("dead with %d attempts counted and %d failed publications seen since its last retry, last error %q",
					d.Attempts, failures, d.LastError), Events: evidence(id)})
		}
	}
	vs = append(vs, h.deadlocks...)
	vs = append(vs, h.checkWrites(t, evidence)...)

	ok, overran, late := 0, 0, 0
	for _, p := range pubs {
		if p.outcome == "ok" {
			ok++
		}
		if p.overran {
			overran++
		}
		if p.lateStart {
			late++
		}
	}
	var errs []string
	for kind, n := range h.errs {
		errs = append(errs, fmt.Sprintf("%s %d", kind, n.Load()))
	}
	slices.Sort(errs)
	var counts []string
	for what, n := range h.counts {
		counts = append(counts, fmt.Sprintf("%s %d", what, n))
	}
	slices.Sort(counts)
	t.Logf("history: %d operations: %d events committed, %d publications (%d successful, %d of events published before, %d returned past their deadline and grace, %d stamped late), %d dead events before the last phase; %s; dispatcher errors: %s",
		h.counts["transactions"]+len(pubs)+h.counts["retries of dead events"], len(committed), len(pubs), ok, ok-len(committed), overran, late,
		len(h.dead), strings.Join(counts, ", "), strings.Join(errs, ", "))
	// A few of each broken check, so that no check hides behind another.
	byCheck := map[string]int{}
	var shown []history.Violation
	for _, v := range vs {
		if byCheck[v.Check]++; byCheck[v.Check] <= 3 {
			shown = append(shown, v)
		}
	}
	for check, n := range byCheck {
		t.Errorf("history: check %q broken %d times", check, n)
	}
	history.Report(t, shown, 40)
}

// checkWrites checks that a dispatcher writes only the events it holds: each write
// that is not a claim finds the owner token of a claim by the same dispatcher.
func (h *hist) checkWrites(t *testing.T, evidence func(ids ...uuid.UUID) []history.Event) []history.Violation {
	rows, err := h.rec.Query(context.Background(), `SELECT tick, event_id, app, old_by, new_by, old_state, new_state FROM hist_writes ORDER BY tick`)
	require.NoError(t, err)
	type write struct {
		tick               int64
		event              uuid.UUID
		app                string
		oldBy, newBy       *uuid.UUID
		oldState, newState string
	}
	writes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (write, error) {
		var w write
		err := r.Scan(&w.tick, &w.event, &w.app, &w.oldBy, &w.newBy, &w.oldState, &w.newState)
		return w, err
	})
	require.NoError(t, err)
	var vs []history.Violation
	owner := map[uuid.UUID]string{} // token -> the dispatcher that claimed with it
	for _, w := range writes {
		if w.newBy != nil && (w.oldBy == nil || *w.oldBy != *w.newBy) {
			owner[*w.newBy] = w.app
			continue
		}
		what := fmt.Sprintf("%s wrote %s (%s -> %s)", strings.TrimPrefix(w.app, "histd-"), short(w.event), w.oldState, w.newState)
		switch {
		case w.oldBy == nil:
			what += ", which no dispatcher held"
		case owner[*w.oldBy] != w.app:
			what += fmt.Sprintf(", which %s held", strings.TrimPrefix(owner[*w.oldBy], "histd-"))
		default:
			continue
		}
		ev := evidence(w.event)
		var at time.Duration
		if len(ev) > 0 {
			at = ev[len(ev)-1].At
		}
		ev = append(ev, history.Event{Seq: int(w.tick), At: at, Kind: "write", Op: "outbox", Key: short(w.event), Detail: what})
		vs = append(vs, history.Violation{Check: "a dispatcher writes only the events it holds", Key: short(w.event), What: what, Events: ev})
	}
	h.counts["dispatcher writes"] = len(writes)
	return vs
}

func ordered(lanes []*histLane) *histLane {
	for _, l := range lanes {
		if l.ordered {
			return l
		}
	}
	return nil
}

// overlap returns two publications that overlap, or nil: ps is in order of start.
func overlap(ps []*histPub) (*histPub, *histPub) {
	var open *histPub // the publication that ends last among those started so far
	for _, p := range ps {
		if p.overran {
			continue // abandoned by its dispatcher: see Publish
		}
		if open != nil && p.start < open.end {
			return open, p
		}
		if open == nil || p.end > open.end {
			open = p
		}
	}
	return nil, nil
}

// timeline is the whole history in the order of its ticks: the log's calls and faults,
// and the stamped publications.
func (h *hist) timeline(pubs []*histPub, committed map[uuid.UUID]histRow) []history.Event {
	var out []history.Event
	for _, e := range h.log.Events() {
		e.Seq = int(h.ticks[e.Seq])
		out = append(out, e)
	}
	for _, p := range pubs {
		detail := h.laneByID[p.lane].name
		if row, ok := committed[p.event]; ok && row.key != "" {
			detail += " key " + row.key
		}
		detail += " by " + p.dispatcher
		out = append(out, history.Event{Seq: int(p.start), At: p.startAt.Sub(h.began), Client: h.clientLocked(p.dispatcher),
			Kind: "start", Op: "publish", Key: short(p.event), Detail: fmt.Sprintf("%s (publication %d)", detail, p.nth+1)})
		if p.end != math.MaxInt64 {
			out = append(out, history.Event{Seq: int(p.end), At: p.endAt.Sub(h.began), Client: h.clientLocked(p.dispatcher),
				Kind: "end", Op: "publish", Key: short(p.event), Detail: detail + ": " + p.outcome})
		}
	}
	slices.SortFunc(out, func(a, b history.Event) int { return a.Seq - b.Seq })
	return out
}

func (h *hist) clientLocked(name string) int {
	n, ok := h.names[name]
	if !ok {
		n = 10 + len(h.names)
		h.names[name] = n
	}
	return n
}

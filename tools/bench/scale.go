package main

import (
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

const scaleSchema = "oncekit_scale"

// scaleEmptySchema holds the empty ledger that Do is timed on beside the full one.
const scaleEmptySchema = "oncekit_scale_empty"

// unpaced are the options of the purges measured beside the defaults, the ledger's, the
// inbox's and the outbox's alike: the defaults before 0.2, batches of 1,000 with no
// pause.
var unpaced = &ledger.PurgeOpts{BatchSize: 1000, Pause: ledger.NoPause}

// publishedIndex is outbox migration 004's index, which the outbox's first purge goes
// without.
const publishedIndex = "outbox_events_published_idx"

// scaleBench measures how the ledger, the inbox and the outbox behave as their tables
// grow: Do's latency at each size beside the same at the first size, the bytes a record
// takes, and what a purge of many expired records costs the traffic that runs beside it.
// Tables are filled by SQL (generate_series), not by calls, with their indexes built
// after the load.
type scaleBench struct {
	sizes []int
	// samples is how many operations of each scenario are timed at each size.
	samples int
	// window bounds how long each purge runs, in phases between which it rests.
	window time.Duration
	// purgeN is how many records each purge deletes; 0 means a tenth of the largest size.
	purgeN int
	// outboxCap bounds the purge of the outbox without an index for published events,
	// whose every batch reads the whole table.
	outboxCap time.Duration
}

// scaleSettings are the scale cluster's settings: durable, with the memory and WAL room
// a server holding tens of millions of records is given. SCALE_SHARED_BUFFERS sets
// shared_buffers instead (such as 8GB).
var scaleSettings = map[string]string{
	"shared_buffers":       "2GB",
	"max_wal_size":         "8GB",
	"maintenance_work_mem": "1GB",
	"work_mem":             "16MB",
}

// scaleServer starts the scale group's cluster, or uses DATABASE_URL.
func scaleServer(ctx context.Context) (string, func(), error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url, func() {}, nil
	}
	settings := maps.Clone(scaleSettings)
	if sb := os.Getenv("SCALE_SHARED_BUFFERS"); sb != "" {
		settings["shared_buffers"] = sb
	}
	c, err := pgtest.StartCluster(ctx, &pgtest.ClusterOpts{Durable: true, Settings: settings})
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(os.Stderr, "bench: scale cluster in %s\n", c.Dir())
	return c.ConnString(), func() { _ = c.Close() }, nil
}

// scaleSizes reads SCALE_SIZES ("0 10000000 50000000" unless set).
func scaleSizes() ([]int, error) {
	s := os.Getenv("SCALE_SIZES")
	if s == "" {
		s = "0 10000000 50000000"
	}
	var sizes []int
	for _, f := range strings.Fields(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("SCALE_SIZES: %q is not a record count: give sizes such as \"0 1000000\"", f)
		}
		sizes = append(sizes, n)
	}
	if len(sizes) == 0 {
		return nil, errors.New("SCALE_SIZES is empty: give sizes such as \"0 1000000\"")
	}
	slices.Sort(sizes)
	return sizes, nil
}

func sizeLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// The generated records' scopes: many tenants, a dozen operations.
const scaleTenants = 2000

var scaleOps = []string{"payments.charge", "payments.refund", "payments.capture", "orders.create", "orders.cancel",
	"shipping.book", "shipping.cancel", "ledger.post", "invoices.issue", "accounts.open", "payouts.send", "webhooks.stripe"}

// scaleKeySQL is record i's key, as keys' strategies and keys.Derive shape them: a run
// and activity ID, a workflow and activity ID, or a derived key. scaleKey is the same
// in Go.
const scaleKeySQL = `CASE i % 3 WHEN 0 THEN 'v1:run:' || md5('r' || i)::uuid::text || ':' || (1 + i % 7)
	WHEN 1 THEN 'v1:wf:order-' || i || ':charge-' || (1 + i % 5)
	ELSE 'stripe-charge.' || left(md5('d' || i), 32) END`

func scaleKey(i int) (tenant, operation string, key keys.Key) {
	md := func(s string) string { h := md5.Sum([]byte(s)); return hex.EncodeToString(h[:]) }
	switch i % 3 {
	case 0:
		key = keys.Key(fmt.Sprintf("v1:run:%s:%d", uuid.Must(uuid.Parse(md("r"+strconv.Itoa(i)))), 1+i%7))
	case 1:
		key = keys.Key(fmt.Sprintf("v1:wf:order-%d:charge-%d", i, 1+i%5))
	default:
		key = keys.Key("stripe-charge." + md("d" + strconv.Itoa(i))[:32])
	}
	return "tenant-" + strconv.Itoa(i%scaleTenants), scaleOps[(i/scaleTenants)%len(scaleOps)], key
}

// fillLedger's rows: completed records created over the 30 hours before $4, in order,
// each kept 24 hours, so that the oldest fifth has expired. $1-$2 the range of i, $3 the
// table's size.
const fillLedger = `INSERT INTO idempotency_records (tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at)
	SELECT 'tenant-' || (i % 2000), (ARRAY['payments.charge', 'payments.refund', 'payments.capture', 'orders.create', 'orders.cancel',
		'shipping.book', 'shipping.cancel', 'ledger.post', 'invoices.issue', 'accounts.open', 'payouts.send', 'webhooks.stripe'])[1 + (i / 2000) % 12],
		` + scaleKeySQL + `, 'v1:' || md5('f' || i) || md5('g' || i), 'completed', 201,
		convert_to('{"id":"' || left(md5('b' || i), 20) || '","status":"created"}', 'UTF8'), 1, t, t, t + interval '24 hours'
	FROM (SELECT i, $4::timestamptz - interval '30 hours' + interval '30 hours' * (i::float8 / $3) AS t
		FROM generate_series($1::bigint, $2::bigint - 1) AS i) AS g`

// fillInbox's rows: messages received over the 72 hours before $4, each kept 24 hours,
// so that the oldest two thirds have expired.
const fillInbox = `INSERT INTO inbox_messages (subscriber, message_id, received_at, expires_at)
	SELECT 'consumer-' || (i % 20), md5('m' || i)::uuid::text, t, t + interval '24 hours'
	FROM (SELECT i, $4::timestamptz - interval '72 hours' + interval '72 hours' * (i::float8 / $3) AS t
		FROM generate_series($1::bigint, $2::bigint - 1) AS i) AS g`

// fillOutbox's rows: events published over the 30 days before $4, in order.
const fillOutbox = `INSERT INTO outbox_events (seq, id, topic, payload, state, attempts, available_at, created_at, published_at)
	SELECT i + 1, md5('e' || i)::uuid, 'entries', convert_to('{"account":"acc-' || (i % 100000) || '","amount":' || (i % 1000) || '}', 'UTF8'),
		'published', 1, t, t, t
	FROM (SELECT i, $4::timestamptz - interval '30 days' + interval '30 days' * (i::float8 / $3) AS t
		FROM generate_series($1::bigint, $2::bigint - 1) AS i) AS g`

// fill empties table and loads n rows by insert (chunks of $1-$2 over $3 rows, $4 the
// generation time), with the table's indexes dropped during the load and built after
// it, as a bulk load is done; skip names indexes to leave out.
func fill(ctx context.Context, pool *pgxpool.Pool, table, insert string, n int, gen time.Time, skip ...string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	type index struct{ name, def, constraint string }
	var idx []index
	rows, err := conn.Query(ctx, `SELECT i.indexname, i.indexdef, coalesce(c.conname, ''), coalesce(pg_get_constraintdef(c.oid), '')
		FROM pg_indexes i LEFT JOIN pg_constraint c ON c.conname = i.indexname AND c.conrelid = $1::regclass
		WHERE i.schemaname = current_schema() AND i.tablename = $2`, table, table)
	if err != nil {
		return err
	}
	for rows.Next() {
		var x index
		var condef string
		if err := rows.Scan(&x.name, &x.def, &x.constraint, &condef); err != nil {
			return err
		}
		if x.constraint != "" {
			x.def = condef
		}
		idx = append(idx, x)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	if err := exec("TRUNCATE " + table); err != nil {
		return err
	}
	for _, x := range idx {
		drop := "DROP INDEX " + pgx.Identifier{x.name}.Sanitize()
		if x.constraint != "" {
			drop = "ALTER TABLE " + table + " DROP CONSTRAINT " + pgx.Identifier{x.name}.Sanitize()
		}
		if err := exec(drop); err != nil {
			return err
		}
	}
	start := time.Now()
	const chunk = 1_000_000
	for lo := 0; lo < n; lo += chunk {
		if err := exec(insert, lo, min(lo+chunk, n), float64(n), gen); err != nil {
			return fmt.Errorf("fill %s: %w", table, err)
		}
		fmt.Fprintf(os.Stderr, "bench: %s: %d of %d rows (%s)\n", table, min(lo+chunk, n), n, time.Since(start).Round(time.Second))
	}
	for _, x := range idx {
		if slices.Contains(skip, x.name) {
			continue
		}
		def := x.def
		if x.constraint != "" {
			def = "ALTER TABLE " + table + " ADD CONSTRAINT " + pgx.Identifier{x.name}.Sanitize() + " " + x.def
		}
		if err := exec(def); err != nil {
			return err
		}
	}
	// A vacuum of an empty table records it as empty, and a statement planned so (as
	// the generic plan of a prepared statement) scans the table in full as it grows: the
	// empty ledger beside it, never vacuumed, would not be its like.
	if n > 0 {
		if err := exec("VACUUM (ANALYZE) " + table); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "bench: %s: %d rows loaded and indexed in %s\n", table, n, time.Since(start).Round(time.Second))
	return exec("CHECKPOINT")
}

// sizes emits table's heap, TOAST and index bytes per row.
func tableBytes(ctx context.Context, pool *pgxpool.Pool, table string, rows int, prefix string, emit func(string, float64)) error {
	if rows == 0 {
		return nil
	}
	var heap, total, index int64
	if err := pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_total_relation_size($1::regclass), pg_indexes_size($1::regclass)`,
		table).Scan(&heap, &total, &index); err != nil {
		return err
	}
	emit(prefix+"table_bytes_per_record", float64(heap)/float64(rows))
	emit(prefix+"toast_bytes_per_record", float64(total-heap-index)/float64(rows))
	emit(prefix+"index_bytes_per_record", float64(index)/float64(rows))
	emit(prefix+"total_gib", float64(total)/(1<<30))
	return nil
}

// timeAll runs every scenario n times, interleaved in bursts of burst in a fresh random
// order each round as interleave does, on one client, and returns every latency in
// microseconds.
func timeAll(ctx context.Context, n, burst int, scens []scenario) (map[string][]float64, error) {
	out := map[string][]float64{}
	order := slices.Clone(scens)
	counter := 0
	for round := -1; round < n/burst; round++ {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, s := range order {
			for range burst {
				counter++
				start := time.Now()
				if err := s.op(ctx, counter); err != nil {
					return nil, fmt.Errorf("%s: %w", s.name, err)
				}
				if round >= 0 {
					out[s.name] = append(out[s.name], float64(time.Since(start).Nanoseconds())/1e3)
				}
			}
		}
	}
	return out, nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[min(len(xs)-1, int(q*float64(len(xs))))]
}

// traffic runs op from clients goroutines, each at most once every tick, until stop
// closes or an op fails, and returns each op's latency in µs with whether phase was odd
// (a purge running) at its start, at its end, or changed while it ran.
func traffic(ctx context.Context, clients int, tick time.Duration, op func(context.Context) error, phase *atomic.Int64, stop <-chan struct{}) (alone, beside []float64, err error) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for range clients {
		wg.Go(func() {
			t := time.NewTicker(tick)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				p0 := phase.Load()
				start := time.Now()
				opErr := op(ctx)
				d := float64(time.Since(start).Nanoseconds()) / 1e3
				p1 := phase.Load()
				mu.Lock()
				if opErr != nil && err == nil {
					err = opErr
				}
				if p0 == p1 && p0%2 == 0 {
					alone = append(alone, d)
				} else {
					beside = append(beside, d)
				}
				mu.Unlock()
				if opErr != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return alone, beside, err
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var lsn int64
	err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}

// purgeRun is one purge measured against the traffic beside it.
type purgeRun struct {
	name string
	// purge purges until it is done or ctx ends, and returns how many rows it deleted.
	purge func(context.Context) (int64, error)
	// limit bounds how long the purge runs in all; 0 means the bench's window.
	limit time.Duration
}

// purgePhase is how long a purge runs, and then rests, in turn while the traffic runs.
const purgePhase = 2 * time.Second

// measurePurge measures each purge against the traffic beside it in the same rounds:
// the traffic runs throughout, and the purge rests for purgePhase, runs as long, rests,
// and so on until it has nothing left or has run for its limit (a checkpoint and a vacuum
// before each purge, so that each starts alike). An operation the purge ran beside at
// any moment counts as beside it, one it ran beside at none as alone, so the drift of a
// shared machine falls on both alike. It emits the purge's rows per second of running,
// its WAL bytes per row (less the traffic's own rate while it rested) and the traffic's
// p50 and p99 beside it and alone. between runs after each purge but the last.
func (b scaleBench) measurePurge(ctx context.Context, pool *pgxpool.Pool, prefix, table string, runs []purgeRun,
	op func(context.Context) error, between func(ctx context.Context, done int) error, emit func(string, float64)) error {
	const clients, tick = 2, 5 * time.Millisecond
	for k, r := range runs {
		for _, sql := range []string{"VACUUM " + table, "CHECKPOINT"} {
			if _, err := pool.Exec(ctx, sql); err != nil {
				return err
			}
		}
		limit := cmp.Or(r.limit, b.window)
		var phase atomic.Int64 // odd while the purge runs
		stop := make(chan struct{})
		var alone, beside []float64
		var trafficErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			alone, beside, trafficErr = traffic(ctx, clients, tick, op, &phase, stop)
		}()
		var deleted int64
		var ran, rested time.Duration
		var walRunning, walResting int64
		rest := func() error {
			lsn0, err := walLSN(ctx, pool)
			if err != nil {
				return err
			}
			start := time.Now()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(purgePhase):
			}
			rested += time.Since(start)
			lsn1, err := walLSN(ctx, pool)
			walResting += lsn1 - lsn0
			return err
		}
		err := func() error {
			if err := rest(); err != nil {
				return err
			}
			for finished := false; !finished && ran < limit; {
				lsn0, err := walLSN(ctx, pool)
				if err != nil {
					return err
				}
				phaseCtx, cancel := context.WithTimeout(ctx, min(purgePhase, limit-ran))
				phase.Add(1)
				start := time.Now()
				n, err := r.purge(phaseCtx)
				ran += time.Since(start)
				phase.Add(1)
				cancel()
				deleted += n
				switch {
				case err == nil:
					finished = true
				case !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
					return fmt.Errorf("%s purge: %w", r.name, err)
				}
				lsn1, err := walLSN(ctx, pool)
				if err != nil {
					return err
				}
				walRunning += lsn1 - lsn0
				if err := rest(); err != nil {
					return err
				}
			}
			return nil
		}()
		close(stop)
		<-done
		if err != nil {
			return err
		}
		if trafficErr != nil {
			return trafficErr
		}
		trafficWAL := 0.0
		if rested > 0 {
			trafficWAL = float64(walResting) / rested.Seconds()
		}
		p := prefix + "purge_" + r.name + "."
		emit(p+"deleted", float64(deleted))
		emit(p+"rows_per_s", float64(deleted)/ran.Seconds())
		emit(p+"seconds", ran.Seconds())
		emit(p+"wal_bytes_per_row", (float64(walRunning)-trafficWAL*ran.Seconds())/float64(max(deleted, 1)))
		emit(p+"traffic_ops_alone", float64(len(alone)))
		emit(p+"traffic_ops_beside", float64(len(beside)))
		emit(p+"traffic_p50_us_alone", quantile(alone, 0.5))
		emit(p+"traffic_p50_us_beside", quantile(beside, 0.5))
		emit(p+"traffic_p99_us_alone", quantile(alone, 0.99))
		emit(p+"traffic_p99_us_beside", quantile(beside, 0.99))
		emit(p+"traffic_p50_ratio", quantile(beside, 0.5)/quantile(alone, 0.5))
		emit(p+"traffic_p99_ratio", quantile(beside, 0.99)/quantile(alone, 0.99))
		if k < len(runs)-1 && between != nil {
			if err := between(ctx, k); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b scaleBench) run(ctx context.Context, out io.Writer) error {
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }
	url, done, err := scaleServer(ctx)
	if err != nil {
		return err
	}
	defer done()
	pool, err := freshSchema(ctx, url, scaleSchema, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL, amount bigint NOT NULL);
		CREATE TABLE entries (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrateSchema(ctx, pool, scaleEmptySchema); err != nil {
		return err
	}
	tables, err := scaleTables()
	if err != nil {
		return err
	}
	if tables["ledger"] {
		gen, err := b.ledgerSizes(ctx, pool, emit)
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		if err := b.ledgerPurge(ctx, pool, gen, emit); err != nil {
			return fmt.Errorf("ledger purge: %w", err)
		}
	}
	if tables["inbox"] {
		if err := b.inboxPurge(ctx, pool, emit); err != nil {
			return fmt.Errorf("inbox purge: %w", err)
		}
	}
	if tables["outbox"] {
		if err := b.outboxPurge(ctx, pool, emit); err != nil {
			return fmt.Errorf("outbox purge: %w", err)
		}
	}
	return nil
}

// scaleTables reads SCALE_TABLES, the tables the scale group measures ("ledger inbox
// outbox" unless set).
func scaleTables() (map[string]bool, error) {
	s := os.Getenv("SCALE_TABLES")
	if s == "" {
		s = "ledger inbox outbox"
	}
	tables := map[string]bool{}
	for _, f := range strings.Fields(s) {
		if f != "ledger" && f != "inbox" && f != "outbox" {
			return nil, fmt.Errorf("SCALE_TABLES: %q is not ledger, inbox or outbox", f)
		}
		tables[f] = true
	}
	return tables, nil
}

func (b scaleBench) purgeSize() int {
	if b.purgeN > 0 {
		return b.purgeN
	}
	return max(b.sizes[len(b.sizes)-1]/10, 10000)
}

// scaleFirst is a first execution under a random generated scope, with a new key shaped
// as keys.Run shapes one.
func scaleFirst(l *ledger.Ledger, fp keys.Fingerprint) func(context.Context) error {
	return func(ctx context.Context) error {
		tenant, op, _ := scaleKey(rand.IntN(1 << 30))
		_, err := l.Do(ctx, ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Run(uuid.NewString(), "charge"), Fingerprint: fp},
			scaleMutation, nil)
		return err
	}
}

func scaleMutation(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
	if _, err := tx.Exec(ctx, insertOrder); err != nil {
		return ledger.Response{}, err
	}
	return ledger.Response{Code: 201, Body: []byte(`{"status":"created"}`)}, nil
}

// ledgerSizes fills the ledger to each size in turn and times Do at each, beside the
// same on an empty ledger in a schema of its own (scaleEmptySchema), interleaved, so
// that the machine's drift falls on both: a first execution (first, first_empty), the
// replay of a key completed moments before (replay, replay_empty), and at sizes above
// zero the replay of a generated, older key (replay_old, against replay_empty); bare,
// the business transaction without the ledger, shows how far the machine itself drifted
// between sizes.
func (b scaleBench) ledgerSizes(ctx context.Context, pool *pgxpool.Pool, emit func(string, float64)) (gen time.Time, err error) {
	fp, _ := keys.FingerprintJSON(map[string]any{"item": "bench", "amount": 100})
	full, err := ledger.New(pool, &ledger.Config{Schema: scaleSchema})
	if err != nil {
		return gen, err
	}
	empty, err := ledger.New(pool, &ledger.Config{Schema: scaleEmptySchema})
	if err != nil {
		return gen, err
	}
	for _, size := range b.sizes {
		gen = time.Now()
		if err := fill(ctx, pool, "idempotency_records", fillLedger, size, gen); err != nil {
			return gen, err
		}
		emit("scale.ledger.fill_seconds."+sizeLabel(size), time.Since(gen).Seconds())
		if os.Getenv("SCALE_PREWARM") == "1" {
			if err := prewarmKey(ctx, pool, "scale.ledger.prewarm_blocks."+sizeLabel(size), emit); err != nil {
				return gen, err
			}
		}
		if _, err := pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{scaleEmptySchema, "idempotency_records"}.Sanitize()); err != nil {
			return gen, err
		}
		scens := []scenario{{"bare", func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, insertOrder); return err })
		}}}
		for _, side := range []struct {
			suffix string
			l      *ledger.Ledger
		}{{"", full}, {"_empty", empty}} {
			// Keys completed just now, for the replay of a recent key.
			recent := make([]ledger.Intent, 2000)
			for i := range recent {
				tenant, op, _ := scaleKey(rand.IntN(1 << 30))
				recent[i] = ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Run(uuid.NewString(), "charge"), Fingerprint: fp}
				if _, err := side.l.Do(ctx, recent[i], scaleMutation, nil); err != nil {
					return gen, err
				}
			}
			first := scaleFirst(side.l, fp)
			scens = append(scens,
				scenario{"first" + side.suffix, func(ctx context.Context, _ int) error { return first(ctx) }},
				scenario{"replay" + side.suffix, func(ctx context.Context, _ int) error {
					return scaleReplay(ctx, side.l, recent[rand.IntN(len(recent))])
				}})
		}
		if size > 0 {
			// A live generated record: the newest four fifths are live, and the newest
			// three quarters stay live for 90 minutes after the fill.
			scens = append(scens, scenario{"replay_old", func(ctx context.Context, _ int) error {
				i := size/4 + rand.IntN(size-size/4)
				tenant, op, key := scaleKey(i)
				return scaleReplay(ctx, full, ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: key, Fingerprint: scaleFingerprint(i)})
			}})
		}
		// Each page a statement dirties first after a checkpoint goes to the WAL whole: a
		// checkpoint just before the timing starts every size alike.
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			return gen, err
		}
		lat, err := timeAll(ctx, b.samples, 10, scens)
		if err != nil {
			return gen, err
		}
		label := sizeLabel(size)
		for _, s := range scens {
			xs := lat[s.name]
			p := "scale.ledger." + s.name
			emit(p+"_p50_us."+label, quantile(xs, 0.5))
			emit(p+"_p99_us."+label, quantile(xs, 0.99))
		}
		for _, r := range [][2]string{{"first", "first_empty"}, {"replay", "replay_empty"}, {"replay_old", "replay_empty"}} {
			if xs, ok := lat[r[0]]; ok {
				ref := lat[r[1]]
				emit("scale.ledger."+r[0]+"_vs_empty_p50."+label, quantile(xs, 0.5)/quantile(ref, 0.5))
				emit("scale.ledger."+r[0]+"_vs_empty_p99."+label, quantile(xs, 0.99)/quantile(ref, 0.99))
			}
		}
		if err := firstCounters(ctx, pool, b.samples, label, full, empty, fp, emit); err != nil {
			return gen, err
		}
		if err := tableBytes(ctx, pool, "idempotency_records", size+2*b.samples+2000, "scale.ledger."+label+".", emit); err != nil {
			return gen, err
		}
	}
	return gen, nil
}

// prewarmKey loads the ledger's primary-key index into shared_buffers with pg_prewarm
// and emits how many blocks it loaded as name.
func prewarmKey(ctx context.Context, pool *pgxpool.Pool, name string, emit func(string, float64)) error {
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err != nil {
		return err
	}
	start := time.Now()
	var blocks int64
	if err := pool.QueryRow(ctx, `SELECT pg_prewarm(conindid::regclass) FROM pg_constraint
		WHERE conrelid = 'idempotency_records'::regclass AND contype = 'p'`).Scan(&blocks); err != nil {
		return fmt.Errorf("pg_prewarm: %w", err)
	}
	fmt.Fprintf(os.Stderr, "bench: idempotency_records_pkey: %d blocks prewarmed in %s\n", blocks, time.Since(start).Round(time.Second))
	emit(name, float64(blocks))
	return nil
}

// serverCounters are the cluster's WAL counters (pg_stat_wal) and the database's block
// reads from outside shared_buffers and hits (pg_stat_database).
type serverCounters struct{ walRecords, walFPI, walBytes, blksRead, blksHit float64 }

// statsFlush is how long the cumulative statistics may lag: an idle server process
// reports its counters within 10 seconds (PGSTAT_IDLE_INTERVAL).
const statsFlush = 11 * time.Second

// readCounters waits for every idle server process to have reported its counters, then
// reads them.
func readCounters(ctx context.Context, pool *pgxpool.Pool) (serverCounters, error) {
	var c serverCounters
	select {
	case <-ctx.Done():
		return c, ctx.Err()
	case <-time.After(statsFlush):
	}
	err := pool.QueryRow(ctx, `SELECT w.wal_records::float8, w.wal_fpi::float8, w.wal_bytes::float8, d.blks_read::float8, d.blks_hit::float8
		FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()`).Scan(&c.walRecords, &c.walFPI, &c.walBytes, &c.blksRead, &c.blksHit)
	return c, err
}

// firstCounters runs n first executions on the full ledger, then n on the empty one,
// each alone after the timed rounds (whose scenarios are interleaved), and emits per
// first execution the WAL records, full-page images and bytes and the database's block
// reads from outside shared_buffers and hits, counted across the server: other work
// (autovacuum, the checkpointer's WAL) counts too.
func firstCounters(ctx context.Context, pool *pgxpool.Pool, n int, label string, full, empty *ledger.Ledger, fp keys.Fingerprint,
	emit func(string, float64)) error {
	c0, err := readCounters(ctx, pool)
	if err != nil {
		return err
	}
	for _, side := range []struct {
		name string
		l    *ledger.Ledger
	}{{"first", full}, {"first_empty", empty}} {
		first := scaleFirst(side.l, fp)
		for range n {
			if err := first(ctx); err != nil {
				return fmt.Errorf("%s: %w", side.name, err)
			}
		}
		c1, err := readCounters(ctx, pool)
		if err != nil {
			return err
		}
		p := "scale.ledger." + side.name
		per := func(a, b float64) float64 { return (b - a) / float64(n) }
		emit(p+"_wal_records."+label, per(c0.walRecords, c1.walRecords))
		emit(p+"_wal_fpi."+label, per(c0.walFPI, c1.walFPI))
		emit(p+"_wal_bytes."+label, per(c0.walBytes, c1.walBytes))
		emit(p+"_blks_read."+label, per(c0.blksRead, c1.blksRead))
		emit(p+"_blks_hit."+label, per(c0.blksHit, c1.blksHit))
		c0 = c1
	}
	return nil
}

// scaleReplay replays in, which must have been completed.
func scaleReplay(ctx context.Context, l *ledger.Ledger, in ledger.Intent) error {
	res, err := l.Do(ctx, in, scaleMutation, &ledger.DoOpts{Mode: ledger.ModeLookUpFirst})
	if err == nil && !res.Replayed {
		err = errors.New("replay ran the mutation")
	}
	return err
}

// scaleFingerprint is the fingerprint fillLedger stores for record i: the replay of an
// old record must present its request's.
func scaleFingerprint(i int) keys.Fingerprint {
	md := func(s string) string { h := md5.Sum([]byte(s)); return hex.EncodeToString(h[:]) }
	return keys.Fingerprint("v1:" + md("f"+strconv.Itoa(i)) + md("g"+strconv.Itoa(i)))
}

// ledgerPurge purges the expired records of the largest size twice, the oldest tenth
// with the default options, then the rest unpaced, each for at most the bench's window,
// with first executions running beside each purge.
func (b scaleBench) ledgerPurge(ctx context.Context, pool *pgxpool.Pool, gen time.Time, emit func(string, float64)) error {
	size := b.sizes[len(b.sizes)-1]
	if size == 0 {
		return nil
	}
	fp, _ := keys.FingerprintJSON(map[string]any{"item": "bench", "amount": 100})
	l, err := ledger.New(pool, &ledger.Config{Schema: scaleSchema})
	if err != nil {
		return err
	}
	// The oldest tenth expired 3 hours before the fill (30 hours of records, kept 24):
	// a ledger whose clock reads that time purges it alone.
	early, err := ledger.New(pool, &ledger.Config{Schema: scaleSchema, Test: ledger.TestConfig{NowFunc: func() time.Time { return gen.Add(-3 * time.Hour) }}})
	if err != nil {
		return err
	}
	runs := []purgeRun{
		{name: "default", purge: func(ctx context.Context) (int64, error) {
			res, err := early.Purge(ctx, nil)
			return res.Deleted, err
		}},
		{name: "unpaced", purge: func(ctx context.Context) (int64, error) {
			res, err := l.Purge(ctx, unpaced)
			return res.Deleted, err
		}},
	}
	return b.measurePurge(ctx, pool, "scale.ledger."+sizeLabel(size)+".", "idempotency_records", runs, scaleFirst(l, fp), nil, emit)
}

// inboxPurge fills the inbox with twice the purge size, half of it expired, and purges
// it with messages handled beside the purge; then refills as many expired records and
// purges again.
func (b scaleBench) inboxPurge(ctx context.Context, pool *pgxpool.Pool, emit func(string, float64)) error {
	n := b.purgeSize()
	gen := time.Now()
	// 48 hours of messages, kept 24: the oldest half has expired.
	fillSQL := strings.ReplaceAll(fillInbox, "72 hours", "48 hours")
	if err := fill(ctx, pool, "inbox_messages", fillSQL, 2*n, gen); err != nil {
		return err
	}
	label := sizeLabel(n)
	if err := tableBytes(ctx, pool, "inbox_messages", 2*n, "scale.inbox."+sizeLabel(2*n)+".", emit); err != nil {
		return err
	}
	ib, err := inbox.New(pool, &inbox.Config{Schema: scaleSchema})
	if err != nil {
		return err
	}
	handle := func(ctx context.Context) error {
		_, err := ib.Handle(ctx, "consumer-"+strconv.Itoa(rand.IntN(20)), uuid.NewString(), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, entry)
			return err
		})
		return err
	}
	purge := func(opts *ledger.PurgeOpts) func(context.Context) (int64, error) {
		return func(ctx context.Context) (int64, error) {
			res, err := ib.Purge(ctx, opts)
			return res.Deleted, err
		}
	}
	refill := func(ctx context.Context) error {
		// n more messages received 48 to 24 hours ago, among the live ones.
		start := time.Now()
		_, err := pool.Exec(ctx, fillSQL, 2*n, 3*n, float64(2*n), gen.Add(-48*time.Hour))
		fmt.Fprintf(os.Stderr, "bench: inbox_messages: %d expired rows added in %s\n", n, time.Since(start).Round(time.Second))
		return err
	}
	runs := []purgeRun{{name: "default", purge: purge(nil)}, {name: "unpaced", purge: purge(unpaced)}}
	return b.measurePurge(ctx, pool, "scale.inbox."+label+".", "inbox_messages", runs, handle, func(ctx context.Context, _ int) error { return refill(ctx) }, emit)
}

// outboxPurge fills the outbox with four times the purge size of published events, over
// 40 days, and purges those older than 30 days without the index of published events
// (for at most outboxCap: each of its statements reads the whole table), then, with
// the index, those older than 20 days, and unpaced those older than 10, with
// events enqueued and dispatched beside each purge: the traffic's latency is from the
// enqueue's start to the publication.
func (b scaleBench) outboxPurge(ctx context.Context, pool *pgxpool.Pool, emit func(string, float64)) error {
	n := b.purgeSize()
	gen := time.Now()
	fillSQL := strings.ReplaceAll(fillOutbox, "30 days", "40 days")
	if err := fill(ctx, pool, "outbox_events", fillSQL, 4*n, gen, publishedIndex); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox_events', 'seq'), $1)`, 4*n+1); err != nil {
		return err
	}
	if err := tableBytes(ctx, pool, "outbox_events", 4*n, "scale.outbox."+sizeLabel(4*n)+".no_index.", emit); err != nil {
		return err
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: scaleSchema})
	if err != nil {
		return err
	}
	var waiting sync.Map // event ID to the channel its publication closes
	d, err := outbox.NewDispatcher(ob, outbox.PublisherFunc(func(_ context.Context, e outbox.Event) error {
		if ch, ok := waiting.LoadAndDelete(e.ID); ok {
			close(ch.(chan struct{}))
		}
		return nil
	}), nil)
	if err != nil {
		return err
	}
	dctx, stopDispatch := context.WithCancel(ctx)
	dispatched := make(chan error, 1)
	go func() { dispatched <- d.Run(dctx) }()
	defer func() { stopDispatch(); <-dispatched }()
	payload := []byte(`{"account":"acc-1","amount":100}`)
	publish := func(ctx context.Context) error {
		id := uuid.Must(uuid.NewV7())
		ch := make(chan struct{})
		waiting.Store(id, ch)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, entry); err != nil {
				return err
			}
			_, err := ob.Enqueue(ctx, tx, outbox.Event{ID: id, Topic: "entries", Payload: payload})
			return err
		})
		if err != nil {
			return err
		}
		select {
		case <-ch:
			return nil
		case <-time.After(time.Minute):
			return errors.New("an enqueued event was not published within a minute")
		}
	}
	age := time.Since(gen)
	purge := func(retention time.Duration, opts *ledger.PurgeOpts) func(context.Context) (int64, error) {
		return func(ctx context.Context) (int64, error) {
			purger, err := outbox.New(pool, &outbox.Config{Schema: scaleSchema, PublishedRetention: retention + age})
			if err != nil {
				return 0, err
			}
			res, err := purger.Purge(ctx, opts)
			return res.Deleted, err
		}
	}
	day := 24 * time.Hour
	runs := []purgeRun{
		{"no_index", purge(30*day, nil), b.outboxCap},
		{"default", purge(20*day, nil), 0},
		{"unpaced", purge(10*day, unpaced), 0},
	}
	index := func(ctx context.Context, done int) error {
		if done > 0 {
			return nil
		}
		start := time.Now()
		if _, err := pool.Exec(ctx, "CREATE INDEX "+publishedIndex+" ON outbox_events (published_at) WHERE state = 'published'"); err != nil {
			return err
		}
		emit("scale.outbox."+sizeLabel(n)+".published_index_build_seconds", time.Since(start).Seconds())
		return tableBytes(ctx, pool, "outbox_events", 4*n, "scale.outbox."+sizeLabel(4*n)+".indexed.", emit)
	}
	return b.measurePurge(ctx, pool, "scale.outbox."+sizeLabel(n)+".", "outbox_events", runs, publish, index, emit)
}

// migrateSchema recreates schema with oncekit's tables.
func migrateSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	_, err = migrate.Up(ctx, conn.Conn(), schema)
	return err
}

package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

const messagingSchema = "oncekit_bench_messaging"

// messagingBench measures the outbox's dispatch throughput with a no-op publisher, and
// the outbox's enqueue and the inbox's handling side by side with the bare business
// transaction.
type messagingBench struct {
	url         string
	rounds      int
	opsPerRound int // a burst of one scenario, per round
	dispatchN   int
}

func (b messagingBench) run(ctx context.Context, out io.Writer) error {
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }
	pool, err := freshSchema(ctx, b.url, messagingSchema, `CREATE TABLE entries (id bigserial PRIMARY KEY, amount bigint NOT NULL);
		CREATE TABLE inbox_floor (LIKE inbox_messages INCLUDING ALL)`)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: messagingSchema})
	if err != nil {
		return err
	}
	ib, err := inbox.New(pool, &inbox.Config{Schema: messagingSchema})
	if err != nil {
		return err
	}
	write := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, entry)
		return err
	}
	payload := []byte(`{"account":"acc-1","amount":100}`)
	floorRow := func() *pgx.QueuedQuery {
		return &pgx.QueuedQuery{SQL: `INSERT INTO inbox_floor (subscriber, message_id, received_at, expires_at) VALUES ('bench', $1, now(), now() + interval '14 days')`,
			Arguments: []any{uuid.NewString()}}
	}
	first, err := inbox.New(pool, &inbox.Config{Schema: messagingSchema, Mode: inbox.ModeRecordWithFirstStatement})
	if err != nil {
		return err
	}
	// The same handler under the ledger, the subscriber as the tenant and the message ID
	// as the key: what an inbox built on the ledger would cost.
	l, err := ledger.New(pool, &ledger.Config{Schema: messagingSchema})
	if err != nil {
		return err
	}
	fp, _ := keys.FingerprintJSON(nil)
	onLedger := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		return ledger.Response{}, write(ctx, tx)
	}
	lat, err := interleave(ctx, b.rounds, b.opsPerRound, 1, []scenario{
		{"bare", func(context.Context, int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx) })
		}},
		{"enqueue", func(context.Context, int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := write(ctx, tx); err != nil {
					return err
				}
				_, err := ob.Enqueue(ctx, tx, outbox.Event{Topic: "entries", Payload: payload})
				return err
			})
		}},
		{"inbox", func(context.Context, int) error {
			_, err := ib.Handle(ctx, "bench", uuid.NewString(), func(ctx context.Context, tx pgx.Tx) error { return write(ctx, tx) })
			return err
		}},
		{"inbox_first", func(context.Context, int) error {
			_, err := first.Handle(ctx, "bench", uuid.NewString(), func(ctx context.Context, tx pgx.Tx) error { return write(ctx, tx) })
			return err
		}},
		{"inbox_on_ledger", func(context.Context, int) error {
			_, err := l.Do(ctx, ledger.Intent{Scope: keys.Scope{Tenant: "bench", Operation: "inbox"}, Key: keys.Key(uuid.NewString()), Fingerprint: fp},
				onLedger, nil)
			return err
		}},
		// The floors of any inbox: the bare transaction plus one row shaped like an
		// inbox record, with no dedup logic. inbox_floor sends the row with BEGIN, in a
		// round trip of its own (3 in all, as the default inbox);
		// inbox_floor_pipelined sends BEGIN, the row and the handler's statement in one
		// (2, as ModeRecordWithFirstStatement); inbox_floor_commit sends the row with
		// COMMIT (3).
		// inbox_floor_lookup is inbox_floor_commit plus the cheapest answer an inbox
		// could have before its handler runs: a read of the record, with BEGIN.
		{"inbox_floor", func(context.Context, int) error {
			return floorTx(ctx, pool, floorRow(), write, nil)
		}},
		{"inbox_floor_pipelined", func(context.Context, int) error {
			return floorTx(ctx, pool, floorRow(), nil, &pgx.QueuedQuery{SQL: entry})
		}},
		{"inbox_floor_commit", func(context.Context, int) error {
			return floorTx(ctx, pool, nil, write, floorRow())
		}},
		{"inbox_floor_lookup", func(context.Context, int) error {
			lookup := &pgx.QueuedQuery{SQL: `SELECT state FROM inbox_floor WHERE subscriber = 'bench' AND message_id = $1`, Arguments: []any{uuid.NewString()}}
			return floorTx(ctx, pool, lookup, write, floorRow())
		}},
	})
	if err != nil {
		return err
	}
	bare := lat["bare"]
	emit("outbox.enqueue_vs_bare", lat["enqueue"]/bare)
	emit("inbox.handle_vs_bare", lat["inbox"]/bare)
	emit("inbox.first_vs_bare", lat["inbox_first"]/bare)
	emit("inbox.on_ledger_vs_bare", lat["inbox_on_ledger"]/bare)
	emit("inbox.on_ledger_vs_first", lat["inbox_on_ledger"]/lat["inbox_first"])
	emit("inbox.floor_vs_bare", lat["inbox_floor"]/bare)
	emit("inbox.floor_pipelined_vs_bare", lat["inbox_floor_pipelined"]/bare)
	emit("inbox.floor_commit_vs_bare", lat["inbox_floor_commit"]/bare)
	emit("inbox.floor_lookup_vs_bare", lat["inbox_floor_lookup"]/bare)
	emit("inbox.handle_vs_floor", lat["inbox"]/lat["inbox_floor"])
	emit("inbox.first_vs_floor", lat["inbox_first"]/lat["inbox_floor_pipelined"])

	// Dispatch throughput: fill the outbox, then drain it with a no-op publisher.
	if _, err := pool.Exec(ctx, `TRUNCATE outbox_events`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, topic, payload)
		SELECT gen_random_uuid(), 'entries', $2::bytea FROM generate_series(1, $1)`, b.dispatchN, payload); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox_events`); err != nil {
		return err
	}
	perSec, err := drainRate(ctx, ob, &outbox.DispatcherConfig{BatchSize: 1000}, b.dispatchN)
	if err != nil {
		return err
	}
	emit("outbox.dispatch_per_s", perSec)
	return b.orderedDrain(ctx, pool, ob, payload, emit)
}

// drainRate drains the outbox with a no-op publisher and returns the events published
// per second; want is how many must be published.
func drainRate(ctx context.Context, ob *outbox.Outbox, cfg *outbox.DispatcherConfig, want int) (float64, error) {
	d, err := outbox.NewDispatcher(ob, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return nil }), cfg)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	total := 0
	for {
		n, err := d.DispatchOnce(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	if total != want {
		return 0, fmt.Errorf("dispatched %d of %d events", total, want)
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// orderedDrain measures how fast an ordered dispatcher drains a backlog of one key.
func (b messagingBench) orderedDrain(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, payload []byte, emit func(string, float64)) error {
	const n = 1000
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_events (id, topic, ordering_key, payload)
		SELECT gen_random_uuid(), 'entries', 'one-key', $1::bytea FROM generate_series(1, $2)`, payload, n); err != nil {
		return err
	}
	perSec, err := drainRate(ctx, ob, &outbox.DispatcherConfig{Ordered: true}, n)
	if err != nil {
		return fmt.Errorf("ordered drain: %w", err)
	}
	emit("outbox.ordered_drain_per_s", perSec)
	return nil
}

const entry = `INSERT INTO entries (amount) VALUES (1)`

// floorTx runs one transaction on a connection of pool: BEGIN, with first in the same
// round trip when it is not nil, then write (when not nil), then COMMIT with last (when
// not nil; with first and BEGIN when write is nil).
func floorTx(ctx context.Context, pool *pgxpool.Pool, first *pgx.QueuedQuery, write func(context.Context, pgx.Tx) error, last *pgx.QueuedQuery) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var tx pgx.Tx
	if first == nil {
		if tx, err = conn.Begin(ctx); err != nil {
			return err
		}
	} else {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		b.QueuedQueries = append(b.QueuedQueries, first)
		if write == nil {
			b.QueuedQueries = append(b.QueuedQueries, last)
			last = nil
		}
		br := conn.SendBatch(ctx, b)
		tx = br.Tx()
		if err := br.Close(); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
	}
	if write != nil {
		if err := write(ctx, tx); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
	}
	return finishFloor(ctx, tx, last)
}

package main

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// The overview's counts read the whole records table. On a large one they are reused
// for a while, and shown as "about".
const (
	// countCacheDefault is how long counts are reused (--count-cache).
	countCacheDefault = 30 * time.Second
	// countCacheRowsDefault is the table size, as PostgreSQL estimates it, from which
	// counts are reused.
	countCacheRowsDefault = 100000
)

// counts are the overview's counts over a shard's records.
type counts struct {
	Stats     ledger.Stats
	Uncertain int64
	// About is set when the counts were reused; At is when they were counted.
	About bool
	At    time.Time
}

// countCache keeps a shard's last counts.
type countCache struct {
	mu   sync.Mutex
	last *counts
}

// counts returns the shard's counts: reused, while fresh enough, on a large table;
// counted again otherwise.
func (c *console) counts(ctx context.Context, s *uiShard) (counts, error) {
	s.counts.mu.Lock()
	defer s.counts.mu.Unlock() // one count at a time per shard: concurrent loads wait for it
	if last := s.counts.last; last != nil && c.countFor > 0 && time.Since(last.At) < c.countFor {
		out := *last
		out.About = true
		return out, nil
	}
	var n counts
	var err error
	if n.Stats, err = s.ledger.Stats(ctx); err != nil {
		return n, err
	}
	table := pgx.Identifier{c.a.schema, "idempotency_records"}.Sanitize()
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE uncertain").Scan(&n.Uncertain); err != nil {
		return n, err
	}
	n.At = time.Now()
	s.counts.last = nil
	var estimate float64
	if err := s.pool.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)", table).Scan(&estimate); err == nil &&
		estimate >= c.countFromRows {
		s.counts.last = &n
	}
	return n, nil
}

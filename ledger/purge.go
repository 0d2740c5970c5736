package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/shard"
)

// PurgeBatchDefault is how many records one purge statement deletes at most.
const PurgeBatchDefault = 1000

// PurgeOpts are options of [Ledger.Purge]. A nil *PurgeOpts means all defaults.
type PurgeOpts struct {
	// BatchSize is the most records one statement deletes, which bounds how long it
	// holds locks. Defaults to [PurgeBatchDefault].
	BatchSize int
	// MaxBatches stops the purge after this many statements (on each shard, for a
	// ledger on several); 0 runs until no expired record is left. Defaults to 0.
	MaxBatches int
	// Pause is how long the purge waits between two statements. A purge of millions of
	// records that never pauses takes a core, the disk and the WAL from the traffic it
	// runs beside; see the operating guide for figures. Defaults to 0: no pause.
	Pause time.Duration
}

// PurgeResult reports what [Ledger.Purge] deleted.
type PurgeResult struct {
	Deleted int64
	Batches int
}

// Purge deletes expired records in batches, oldest first, on every shard in turn. Records whose lease is still
// live are kept. Many purgers may run at once, on many nodes: each batch skips rows
// another purger has locked. Expiry does not wait for the purge: an expired record
// already counts as absent.
func (l *Ledger) Purge(ctx context.Context, opts *PurgeOpts) (PurgeResult, error) {
	var res PurgeResult
	err := l.r.Each(func(s shard.Shard) error {
		r, err := l.purge(ctx, s.Pool, opts)
		res.Deleted += r.Deleted
		res.Batches += r.Batches
		return err
	})
	return res, err
}

// PurgeTx is [Ledger.Purge] inside the caller's transaction.
func (l *Ledger) PurgeTx(ctx context.Context, tx pgx.Tx, opts *PurgeOpts) (PurgeResult, error) {
	return l.purge(ctx, tx, opts)
}

func (l *Ledger) purge(ctx context.Context, q querier, opts *PurgeOpts) (PurgeResult, error) {
	o := PurgeOpts{}
	if opts != nil {
		o = *opts
	}
	if o.BatchSize == 0 {
		o.BatchSize = PurgeBatchDefault
	}
	if o.BatchSize < 0 || o.MaxBatches < 0 || o.Pause < 0 {
		return PurgeResult{}, errors.New("oncekit/ledger: PurgeOpts values must not be negative")
	}
	var res PurgeResult
	var err error
	res.Deleted, res.Batches, err = l.q.purge.Run(ctx, q, o.BatchSize, o.MaxBatches, o.Pause, l.now())
	if l.tel.metrics {
		l.tel.purged.Add(ctx, res.Deleted)
	}
	if err != nil {
		return res, fmt.Errorf("oncekit/ledger: purge: %w", err)
	}
	l.tel.log.LogAttrs(ctx, slog.LevelInfo, "oncekit: purged expired ledger records",
		slog.Int64("oncekit.deleted", res.Deleted), slog.Int("oncekit.batches", res.Batches))
	return res, nil
}

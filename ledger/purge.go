package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/shard"
)

// PurgeBatchDefault is how many rows one purge statement deletes at most.
const PurgeBatchDefault = config.PurgeBatchDefault

// PurgePauseDefault is how long a purge waits between two statements, unless
// [PurgeOpts].Pause says otherwise. At 50 million records, a purge in batches of 1,000
// that never paused raised the p99 latency of the traffic beside it 1.84 to 1.88 times;
// one with the defaults, 1.20 times, deleting 9,000 records a second (docs/performance.md).
const PurgePauseDefault = config.PurgePauseDefault

// NoPause, as [PurgeOpts].Pause, purges without pausing between statements, as fast as
// the server allows: any negative value does.
const NoPause time.Duration = -1

// PurgeOpts are the options of every oncekit purge: [Ledger.Purge] and the Purge of the
// inbox, the outbox and the agent's guard, which take this one type. A nil *PurgeOpts
// means all defaults; a negative BatchSize or MaxBatches is refused before anything is
// deleted.
type PurgeOpts struct {
	// BatchSize is the most rows one statement deletes, which bounds how long it
	// holds locks. Defaults to [PurgeBatchDefault].
	BatchSize int
	// MaxBatches stops the purge after this many statements (on each shard, for a
	// store on several); 0 runs until nothing purgeable is left. Defaults to 0.
	MaxBatches int
	// Pause is how long the purge waits between two statements. A purge of millions of
	// rows that never pauses takes a core, the disk and the WAL from the traffic it
	// runs beside; see the operating guide for figures. Defaults to
	// [PurgePauseDefault]; [NoPause] (any negative value) does not pause.
	Pause time.Duration
}

// PurgeResult reports what a purge deleted: [Ledger.Purge] and every other Purge that
// takes [PurgeOpts].
type PurgeResult struct {
	// Deleted is how many rows the purge deleted.
	Deleted int64
	// Batches is how many delete statements it ran, over every shard.
	Batches int
}

// Purge deletes expired records in batches, oldest first, on every shard in turn. Records whose lease is still
// live are kept. Many purgers may run at once, on many nodes: each batch skips rows
// another purger has locked. Expiry does not wait for the purge: an expired record
// already counts as absent. A context that ends stops the purge between two statements
// with the context's error and what was deleted; a statement already running is let
// finish for up to 10 seconds, and what it deleted is counted.
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
	o := config.Of(opts)
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

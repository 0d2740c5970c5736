package agent

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/ledger"
)

// Purge deletes the frozen calls (arguments and approvals) whose retention ran out, in
// batches, as ledger.Ledger.Purge does for the calls' records, with the same options.
// Purge the ledger too: a call's record and its frozen arguments expire together when
// [Config].Retention equals the ledger's retention of [OperationTool].
func (g *Guard) Purge(ctx context.Context, opts *ledger.PurgeOpts) (ledger.PurgeResult, error) {
	o := config.Of(opts)
	var res ledger.PurgeResult
	var err error
	res.Deleted, res.Batches, err = g.q.purge.Run(ctx, g.pool, o.BatchSize, o.MaxBatches, o.Pause, g.now())
	if err != nil {
		return res, fmt.Errorf("oncekit/agent: purge: %w", err)
	}
	return res, nil
}

// Purgeable counts the frozen calls whose retention ran out: those [Guard.Purge] would
// delete now.
func (g *Guard) Purgeable(ctx context.Context) (int64, error) {
	var n int64
	if err := g.pool.QueryRow(ctx, g.q.purgeable, g.now()).Scan(&n); err != nil {
		return 0, fmt.Errorf("oncekit/agent: count purgeable calls: %w", err)
	}
	return n, nil
}

package main

import (
	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// agentPurge returns the purge step of the agent's frozen tool calls (agent_calls), or
// none when the schema has not applied the agent's migration line: a schema set up
// with another tool may hold the ledger without the agent's table.
func (a *app) agentPurge(l *ledger.Ledger, p purgeFlags) ([]purgeStep, error) {
	versions, err := migrate.Versions(a.ctx, a.pool, a.schema)
	if err != nil {
		return nil, err
	}
	if versions[agent.MigrationLine] == 0 {
		return nil, nil
	}
	g, err := agent.New(l, nil)
	if err != nil {
		return nil, err
	}
	return []purgeStep{{table: "agent_calls", what: "expired frozen tool calls",
		count: func() (int64, error) { return g.Purgeable(a.ctx) },
		purge: func() (int64, int, error) {
			res, err := g.Purge(a.ctx, p.opts())
			return res.Deleted, res.Batches, err
		}}}, nil
}

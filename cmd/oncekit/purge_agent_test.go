package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
)

// purge counts the agent's expired frozen calls and deletes them with -y, beside the
// ledger's records; a schema without the agent's migration line is purged without them.
func TestPurge_AgentCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	g, err := agent.New(b.ledger, nil)
	require.NoError(t, err)
	task := g.Task("acme", "ticket-1")
	for _, step := range []string{"1", "2"} {
		_, err := task.Call(ctx, step, agent.Tool{Name: "send_email"}, json.RawMessage(`{"to":"a@example.com"}`),
			func(context.Context, agent.Invocation) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }, nil)
		require.NoError(t, err)
	}
	calls := pgx.Identifier{b.schema, "agent_calls"}.Sanitize()
	_, err = b.pool.Exec(ctx, "UPDATE "+calls+" SET expires_at = now() - interval '1 hour' WHERE step = '1'")
	require.NoError(t, err)

	counts := func(pv purgeView) map[string]int64 {
		m := map[string]int64{}
		for _, tb := range pv.Tables {
			m[strings.TrimPrefix(tb.Table, b.schema+".")] = tb.Count
		}
		return m
	}
	var pv purgeView
	r := b.runJSON(t, &pv, "purge")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.Equal(t, int64(1), counts(pv)["agent_calls"])
	r = b.run(t, "purge", "-y")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Regexp(t, `(?m)^purged +`+b.schema+`\.agent_calls +1 expired frozen tool calls in 1 batch$`, r.out)
	rows, err := b.pool.Query(ctx, "SELECT step FROM "+calls)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"2"}, left, "the call within its retention stays")

	// A schema whose agent line was never applied.
	_, err = b.pool.Exec(ctx, "DROP TABLE "+calls)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{b.schema, "oncekit_migrations"}.Sanitize()+" WHERE line = $1", agent.MigrationLine)
	require.NoError(t, err)
	r = b.runJSON(t, &pv, "purge")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.NotContains(t, counts(pv), "agent_calls")
	require.Len(t, pv.Tables, 3)
}

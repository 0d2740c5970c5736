package testsuite_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/testsuite"
)

// agentSetup returns a guard and a pool holding sent_emails, an email provider's table
// whose optional key deduplicates.
func agentSetup(t *testing.T) (*agent.Guard, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE sent_emails (id bigserial PRIMARY KEY, task text NOT NULL, idem_key text UNIQUE)`)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	g, err := agent.New(l, nil)
	require.NoError(t, err)
	return g, pool
}

func sendWith(pool *pgxpool.Pool, key func(agent.Invocation) *string) agent.ToolFunc {
	return func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		var id int64
		err := pool.QueryRow(ctx, `INSERT INTO sent_emails (task, idem_key) VALUES ($1, $2)
			ON CONFLICT (idem_key) DO UPDATE SET idem_key = excluded.idem_key RETURNING id`, inv.Call.Task, key(inv)).Scan(&id)
		if err != nil {
			return nil, ledger.NotApplied(err)
		}
		return json.RawMessage(`{"id":` + strconv.FormatInt(id, 10) + `}`), nil
	}
}

func countSent(pool *pgxpool.Pool) func(context.Context, agent.CallRef) (int, error) {
	return func(ctx context.Context, ref agent.CallRef) (int, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM sent_emails WHERE task = $1", ref.Task).Scan(&n)
		return n, err
	}
}

// Well-behaved tools of the three kinds pass the check; a tool that says it accepts a
// key and sends a fresh one on every attempt fails it.
func TestCheckAgentTool(t *testing.T) {
	t.Parallel()
	g, pool := agentSetup(t)
	downstream := func(inv agent.Invocation) *string { k := string(inv.DownstreamKey); return &k }
	none := func(agent.Invocation) *string { return nil }
	args := json.RawMessage(`{"to":"ann@example.com"}`)

	t.Run("EmailAPI", func(t *testing.T) {
		testsuite.CheckAgentTool(t, testsuite.ToolCase{Guard: g, Tool: agent.Tool{Name: "send_email", AcceptsKey: true},
			Func: sendWith(pool, downstream), Args: args, Effects: countSent(pool)})
	})
	t.Run("SMTP", func(t *testing.T) {
		reps, err := testsuite.RunAgentTool(testsuite.ToolCase{Guard: g, Tool: agent.Tool{Name: "smtp_send"},
			Func: sendWith(pool, none), Args: args, Effects: countSent(pool)})
		require.NoError(t, err)
		require.Len(t, reps, 3)
		for _, r := range reps[:2] {
			require.NoError(t, r.Problem(agent.Tool{Name: "smtp_send"}))
			require.True(t, r.Uncertain, "a tool without a key is reported uncertain after %s", r.Fault)
		}
	})
	t.Run("Local", func(t *testing.T) {
		testsuite.CheckAgentTool(t, testsuite.ToolCase{Guard: g, Tool: agent.Tool{Name: "note"}, Args: args, Effects: countSent(pool),
			Local: func(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
				_, err := tx.Exec(ctx, "INSERT INTO sent_emails (task) VALUES ($1)", inv.Call.Task)
				return json.RawMessage(`{}`), err
			}})
	})
	t.Run("FreshKeyFails", func(t *testing.T) {
		tool := agent.Tool{Name: "send_email_badly", AcceptsKey: true}
		reps, err := testsuite.RunAgentTool(testsuite.ToolCase{Guard: g, Tool: tool, Args: args, Effects: countSent(pool),
			Func: sendWith(pool, func(agent.Invocation) *string { k := uuid.NewString(); return &k })})
		require.NoError(t, err)
		require.ErrorContains(t, reps[0].Problem(tool), "send agent.Invocation.DownstreamKey")
		require.Equal(t, 2, reps[0].Effects)
	})
}

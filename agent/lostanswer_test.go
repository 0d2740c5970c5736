package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// lossy returns a guard on the bundle's schema and clock whose connections pass through
// a fault proxy with plan. The proxy starts off: a test turns it on around the call
// whose answer it loses.
func (b *bundle) lossy(t testing.TB, plan faultproxy.Plan, cfg *agent.Config) (*agent.Guard, *faultproxy.Proxy) {
	t.Helper()
	cc, err := pgconn.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	network, addr := faultproxy.Target(cc)
	p, err := faultproxy.New(network, addr, plan)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	p.SetEnabled(false)
	pool := pgtest.PoolOn(t, pgtest.URL(t), b.schema, func(c *pgxpool.Config) {
		p.Route(&c.ConnConfig.Config)
		// One round trip per statement and no ping on acquire, so that the round trip
		// whose answer the plan loses is the statement's own.
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	g, _ := b.guard(t, pool, cfg)
	return g, p
}

// Finish retried after its answer was lost succeeds when the first Finish committed;
// another outcome is refused as a finished task, and another owner's Finish stays
// fenced.
func TestTask_FinishRetryAfterLostAnswer(t *testing.T) {
	t.Parallel()
	_, b := setup(t, nil)
	g, proxy := b.lossy(t, faultproxy.Plan{Seed: 1, SyncLost: 1}, &agent.Config{TaskLease: time.Minute})
	ctx := context.Background()

	a, err := g.ClaimTask(ctx, "acme", "t1", nil)
	require.NoError(t, err)
	proxy.SetEnabled(true)
	err = a.Finish(ctx, json.RawMessage(`{"done":true}`))
	proxy.SetEnabled(false)
	require.EqualValues(t, 1, proxy.Count(faultproxy.CommitLost))
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.NoError(t, a.Finish(ctx, json.RawMessage(`{"done":true}`)), "the owner's retry of a Finish that committed")
	require.NoError(t, a.Finish(ctx, json.RawMessage(`{"done":true}`)))
	err = a.Finish(ctx, json.RawMessage(`{"done":false}`))
	require.ErrorIs(t, err, agent.ErrTaskDone)
	require.NotErrorIs(t, err, agent.ErrStaleOwner)
	_, err = g.ClaimTask(ctx, "acme", "t1", nil)
	require.ErrorIs(t, err, agent.ErrTaskDone)

	// An owner whose task was taken over and finished by another stays fenced.
	old, err := g.ClaimTask(ctx, "acme", "t2", nil)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	taker, err := g.ClaimTask(ctx, "acme", "t2", nil)
	require.NoError(t, err)
	require.NoError(t, taker.Finish(ctx, nil))
	require.NoError(t, taker.Finish(ctx, nil))
	require.ErrorIs(t, old.Finish(ctx, nil), agent.ErrStaleOwner)
}

// A tool acted and its output is over the ledger's body limit: the call is recorded as
// one that may have happened. A tool without a key is reported uncertain, now and on
// every retry, and does not start again until an operator settles it; one with a key is
// made again with the same downstream key.
func TestCall_OutputOverTheLimit(t *testing.T) {
	t.Parallel()
	g, b := setup(t, nil)
	ctx := context.Background()
	task := g.Task("acme", "ticket-big")
	var invs []agent.Invocation
	big := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		invs = append(invs, inv)
		return json.RawMessage(`{"v":"` + strings.Repeat("a", ledger.MaxBodyDefault) + `"}`), nil
	}

	t.Run("Plain", func(t *testing.T) {
		invs = nil
		_, err := task.Call(ctx, "1", smtpSend, nil, big, nil)
		var unc *agent.UncertainError
		require.ErrorAs(t, err, &unc)
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge, "the reason goes with the report")
		for _, lapse := range []time.Duration{0, time.Hour} {
			b.clock.Advance(lapse)
			_, err = task.Call(ctx, "1", smtpSend, nil, big, nil)
			require.ErrorIs(t, err, agent.ErrUncertain)
		}
		require.Len(t, invs, 1)
		require.NoError(t, g.Resolve(ctx, unc.Call, true, json.RawMessage(`{"ref":"stored elsewhere"}`)))
		res, err := task.Call(ctx, "1", smtpSend, nil, big, nil)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.JSONEq(t, `{"ref":"stored elsewhere"}`, string(res.Output))
		require.Len(t, invs, 1)
	})
	t.Run("Keyed", func(t *testing.T) {
		invs = nil
		_, err := task.Call(ctx, "2", emailAPI, nil, big, nil)
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
		require.NotErrorIs(t, err, agent.ErrUncertain)
		_, err = task.Call(ctx, "2", emailAPI, nil, big, nil)
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
		require.Len(t, invs, 2)
		require.True(t, invs[1].Redrive)
		require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
	})
}

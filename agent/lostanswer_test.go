package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
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

// A call whose claim committed and whose commit's answer was lost hears an
// outcome-unknown error, and its tool has not started. A retry resumes the claim and
// runs the tool once, as a first attempt, whether or not the claim's lease ran out
// meanwhile; a retry with other arguments is refused and leaves the claim to resume.
func TestCall_LostClaimCommitResumes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		tool  agent.Tool
		lapse time.Duration
	}{
		{"PlainLeaseLapsed", smtpSend, time.Minute},
		{"PlainLeaseLive", smtpSend, 0},
		{"KeyedLeaseLapsed", emailAPI, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, b := setup(t, nil)
			g, proxy := b.lossy(t, faultproxy.Plan{Seed: 1, CommitLost: 1}, &agent.Config{CallLease: 30 * time.Second})
			ctx := context.Background()
			task := g.Task("acme", "ticket-lost")
			args := json.RawMessage(`{"to":"a@example.com"}`)
			var starts atomic.Int32
			var invs []agent.Invocation
			tool := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				starts.Add(1)
				invs = append(invs, inv)
				return json.RawMessage(`{"sent":true}`), nil
			}

			proxy.SetEnabled(true)
			_, err := task.Call(ctx, "1", tc.tool, args, tool, nil)
			proxy.SetEnabled(false)
			require.EqualValues(t, 1, proxy.Count(faultproxy.CommitLost))
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
			require.NotErrorIs(t, err, agent.ErrUncertain)
			var unknown *ledger.OutcomeUnknownError
			require.ErrorAs(t, err, &unknown)
			require.NotEqual(t, uuid.Nil, unknown.Token)
			require.Zero(t, starts.Load(), "the tool started although its claim's commit was unknown")
			rec, err := b.l.Get(ctx, unknown.Scope, unknown.Key)
			require.NoError(t, err, "the claim committed on the server")
			require.Equal(t, unknown.Token, rec.OwnerToken)

			b.clock.Advance(tc.lapse)
			_, err = task.Call(ctx, "1", tc.tool, json.RawMessage(`{"to":"b@example.com"}`), tool, nil)
			require.ErrorIs(t, err, agent.ErrArgumentsChanged)
			res, err := task.Call(ctx, "1", tc.tool, args, tool, nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.EqualValues(t, 1, starts.Load())
			require.Equal(t, 1, invs[0].Attempt)
			require.False(t, invs[0].Redrive, "the resumed claim is the first attempt's")

			res, err = task.Call(ctx, "1", tc.tool, args, tool, nil)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.EqualValues(t, 1, starts.Load())
		})
	}
}

// A remembered claim is resumed only while the record is still its own: one that is
// gone (as when the commit did not happen) is claimed afresh, and one another process
// took over is reported as that process left it.
func TestCall_LostClaimNoLongerOwned(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		meddle  func(t *testing.T, b *bundle, other *agent.Guard, key string)
		runs    int32
		wantErr error
	}{
		{"Gone", func(t *testing.T, b *bundle, _ *agent.Guard, key string) {
			_, err := b.pool.Exec(context.Background(), `DELETE FROM `+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+` WHERE key = $1`, key)
			require.NoError(t, err)
		}, 1, nil},
		{"TakenOverElsewhere", func(t *testing.T, b *bundle, other *agent.Guard, _ string) {
			b.clock.Advance(time.Hour)
			_, err := other.Task("acme", "ticket-lost").Call(context.Background(), "1", smtpSend, nil,
				func(context.Context, agent.Invocation) (json.RawMessage, error) {
					t.Error("a take-over of a claim that may have acted started the tool")
					return nil, nil
				}, nil)
			require.ErrorIs(t, err, agent.ErrUncertain, "a process that lost nothing cannot tell")
		}, 0, agent.ErrUncertain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			other, b := setup(t, nil)
			g, proxy := b.lossy(t, faultproxy.Plan{Seed: 1, CommitLost: 1}, nil)
			ctx := context.Background()
			task := g.Task("acme", "ticket-lost")
			var starts atomic.Int32
			tool := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				starts.Add(1)
				return json.RawMessage(`{"sent":true}`), nil
			}
			proxy.SetEnabled(true)
			_, err := task.Call(ctx, "1", smtpSend, nil, tool, nil)
			proxy.SetEnabled(false)
			var unknown *ledger.OutcomeUnknownError
			require.ErrorAs(t, err, &unknown)
			tc.meddle(t, b, other, string(unknown.Key))
			_, err = task.Call(ctx, "1", smtpSend, nil, tool, nil)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.runs, starts.Load())
		})
	}
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

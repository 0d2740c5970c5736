package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// A retry whose model chose other arguments for the same step is refused with both
// argument sets, and the tool does not run again; a replay returns the stored output.
func TestCall_ChangedArgumentsRefused(t *testing.T) {
	t.Parallel()
	g, b := setup(t, nil)
	ctx := context.Background()
	p := &provider{pool: b.pool}
	task := g.Task("acme", "ticket-1")

	first, err := task.Call(ctx, "1", emailAPI, json.RawMessage(`{"to":"a@example.com", "body":"hi"}`), p.keyed, nil)
	require.NoError(t, err)
	require.False(t, first.Replayed)

	again, err := task.Call(ctx, "1", emailAPI, json.RawMessage(`{"body":"hi","to":"a@example.com"}`), p.keyed, nil)
	require.NoError(t, err, "the same arguments in another order are the same call")
	require.True(t, again.Replayed)
	require.JSONEq(t, string(first.Output), string(again.Output))

	_, err = task.Call(ctx, "1", emailAPI, json.RawMessage(`{"to":"b@example.com","body":"hi"}`), p.keyed, nil)
	var changed *agent.ArgumentsChangedError
	require.ErrorAs(t, err, &changed)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)
	require.JSONEq(t, `{"to":"a@example.com","body":"hi"}`, string(changed.Stored))
	require.JSONEq(t, `{"to":"b@example.com","body":"hi"}`, string(changed.New))
	require.Equal(t, "1", changed.Call.Step)

	t.Run("Local", func(t *testing.T) {
		_, err := task.CallTx(ctx, "2", ticket, json.RawMessage(`{"title":"refund"}`), p.local, nil)
		require.NoError(t, err)
		_, err = task.CallTx(ctx, "2", ticket, json.RawMessage(`{"title":"refund twice"}`), p.local, nil)
		require.ErrorAs(t, err, &changed)
		require.JSONEq(t, `{"title":"refund"}`, string(changed.Stored))
	})
	require.EqualValues(t, 2, p.calls.Load())
	require.Equal(t, 1, effects(t, b.pool, first.Call))
}

// The stored output goes back on every replay, byte for byte, and the tool runs once.
func TestCall_ReplayReturnsStoredResult(t *testing.T) {
	t.Parallel()
	g, b := setup(t, nil)
	ctx := context.Background()
	p := &provider{pool: b.pool}
	task := g.Task("acme", "ticket-2")
	for _, tc := range []struct {
		name string
		call func() (agent.Result, error)
	}{
		{"Keyed", func() (agent.Result, error) { return task.Call(ctx, "1", emailAPI, nil, p.keyed, nil) }},
		{"Plain", func() (agent.Result, error) { return task.Call(ctx, "2", smtpSend, nil, p.plain, nil) }},
		{"Local", func() (agent.Result, error) { return task.CallTx(ctx, "3", ticket, nil, p.local, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := tc.call()
			require.NoError(t, err)
			for range 3 {
				res, err := tc.call()
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, first.Output, res.Output)
			}
			require.Equal(t, 1, effects(t, b.pool, first.Call))
		})
	}
	require.EqualValues(t, 3, p.calls.Load())
}

// Fifty deliveries of the same task at once run each tool once: every delivery gets
// the output of the one that ran it.
func TestCall_ConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	g, b := setup(t, nil)
	ctx := context.Background()
	p := &provider{pool: b.pool}
	const n = 50
	outs := make([][]json.RawMessage, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			task := g.Task("acme", "ticket-3")
			opts := &agent.CallOpts{Wait: 20 * time.Second}
			args := json.RawMessage(`{"to":"a@example.com"}`)
			r1, err := task.Call(ctx, "1", emailAPI, args, p.keyed, opts)
			if err != nil {
				errs <- err
				return
			}
			r2, err := task.Call(ctx, "2", smtpSend, args, p.plain, opts)
			if err != nil {
				errs <- err
				return
			}
			r3, err := task.CallTx(ctx, "3", ticket, args, p.local, opts)
			if err != nil {
				errs <- err
				return
			}
			outs[i] = []json.RawMessage{r1.Output, r2.Output, r3.Output}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range n {
		require.Equal(t, outs[0], outs[i])
	}
	require.EqualValues(t, 3, p.calls.Load())
	var total int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM effects").Scan(&total))
	require.Equal(t, 3, total)

	t.Run("TaskClaims", func(t *testing.T) {
		// Fifty agents polling the same task: one claims it, the others are refused.
		var claimed sync.WaitGroup
		var mu sync.Mutex
		owners := 0
		for range n {
			claimed.Go(func() {
				task, err := g.ClaimTask(ctx, "acme", "ticket-4", nil)
				if errors.Is(err, ledger.ErrInProgress) {
					return
				}
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				owners++
				mu.Unlock()
				_, err = task.Call(ctx, "1", smtpSend, nil, p.plain, nil)
				assertNoError(t, err)
			})
		}
		claimed.Wait()
		require.Equal(t, 1, owners)
		ref, _ := g.Ref("acme", "ticket-4", "1", smtpSend.Name)
		require.Equal(t, 1, effects(t, b.pool, ref))
	})
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// A dead agent's task is taken over after its lease ran out: the new owner's calls
// replay what the dead one did, and the stale owner's calls, heartbeats and finish are
// refused.
func TestTask_StaleOwnerFenced(t *testing.T) {
	t.Parallel()
	g, b := setup(t, &agent.Config{TaskLease: time.Minute})
	ctx := context.Background()
	p := &provider{pool: b.pool}

	a, err := g.ClaimTask(ctx, "acme", "ticket-5", nil)
	require.NoError(t, err)
	require.False(t, a.TakenOver)
	done, err := a.Call(ctx, "1", smtpSend, json.RawMessage(`{"to":"a@example.com"}`), p.plain, nil)
	require.NoError(t, err)

	_, err = g.ClaimTask(ctx, "acme", "ticket-5", nil)
	require.ErrorIs(t, err, ledger.ErrInProgress, "a live claim is not taken over")

	b.clock.Advance(2 * time.Minute) // a stops heartbeating
	c, err := g.ClaimTask(ctx, "acme", "ticket-5", nil)
	require.NoError(t, err)
	require.True(t, c.TakenOver)
	require.Equal(t, 2, c.Attempt)

	_, err = a.Call(ctx, "2", smtpSend, nil, p.plain, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner)
	_, err = a.CallTx(ctx, "3", ticket, nil, p.local, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner)
	require.ErrorIs(t, a.Heartbeat(ctx), agent.ErrStaleOwner)
	var stale *agent.StaleOwnerError
	require.ErrorAs(t, a.Finish(ctx, nil), &stale)
	require.Equal(t, "ticket-5", stale.Task)

	replay, err := c.Call(ctx, "1", smtpSend, json.RawMessage(`{"to":"a@example.com"}`), p.plain, nil)
	require.NoError(t, err)
	require.True(t, replay.Replayed)
	require.Equal(t, done.Output, replay.Output)
	require.NoError(t, c.Heartbeat(ctx))
	require.NoError(t, c.Finish(ctx, json.RawMessage(`{"status":"solved"}`)))
	_, err = g.ClaimTask(ctx, "acme", "ticket-5", nil)
	require.ErrorIs(t, err, agent.ErrTaskDone)
	require.EqualValues(t, 1, p.calls.Load())
}

// A call that needs a person is frozen before anyone sees it; the approval binds to its
// arguments, the approved call runs once, a changed call is refused, and a call nobody
// decided in time is rejected.
func TestApproval(t *testing.T) {
	t.Parallel()
	g, b := setup(t, &agent.Config{ApprovalTimeout: time.Hour})
	ctx := context.Background()
	p := &provider{pool: b.pool}
	refund := agent.Tool{Name: "refund", AcceptsKey: true, NeedsApproval: true}
	task := g.Task("acme", "ticket-6")
	args := json.RawMessage(`{"charge":"ch_1","amount":500}`)

	_, err := task.Call(ctx, "1", refund, args, p.keyed, nil)
	var pending *agent.ApprovalPendingError
	require.ErrorAs(t, err, &pending)
	require.Zero(t, p.calls.Load())
	waiting, err := g.Waiting(ctx, "acme", 10)
	require.NoError(t, err)
	require.Len(t, waiting, 1)
	frozen := waiting[0]
	require.JSONEq(t, string(args), string(frozen.Args))
	require.Equal(t, "refund", frozen.Call.Tool)

	forged := frozen
	forged.Fingerprint = keys.FingerprintBytes([]byte(`{"charge":"ch_1","amount":5000}`))
	require.ErrorIs(t, g.Approve(ctx, forged, "ops@acme", "ok"), agent.ErrNotWaiting, "an approval binds to the frozen arguments")

	_, err = task.Call(ctx, "1", refund, json.RawMessage(`{"charge":"ch_1","amount":5000}`), p.keyed, nil)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged, "a changed call is not the approved one")

	require.NoError(t, g.Approve(ctx, frozen, "ops@acme", "customer asked"))
	require.ErrorIs(t, g.Approve(ctx, frozen, "ops@acme", "again"), agent.ErrNotWaiting)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			_, err := task.Call(ctx, "1", refund, args, p.keyed, &agent.CallOpts{Wait: 10 * time.Second})
			assertNoError(t, err)
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, p.calls.Load(), "an approved call runs once")
	_, err = task.Call(ctx, "1", refund, json.RawMessage(`{"charge":"ch_1","amount":5000}`), p.keyed, nil)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)

	t.Run("Rejected", func(t *testing.T) {
		_, err := task.Call(ctx, "2", refund, args, p.keyed, nil)
		require.ErrorIs(t, err, agent.ErrApprovalPending)
		w, err := g.Waiting(ctx, "acme", 10)
		require.NoError(t, err)
		require.Len(t, w, 1)
		require.NoError(t, g.Reject(ctx, w[0], "ops@acme", "not refundable"))
		_, err = task.Call(ctx, "2", refund, args, p.keyed, nil)
		var rej *agent.RejectedError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, "ops@acme", rej.By)
		require.False(t, rej.TimedOut)
	})
	t.Run("TimedOut", func(t *testing.T) {
		_, err := task.Call(ctx, "3", refund, args, p.keyed, nil)
		require.ErrorIs(t, err, agent.ErrApprovalPending)
		w, err := g.Waiting(ctx, "acme", 10)
		require.NoError(t, err)
		require.Len(t, w, 1)
		b.clock.Advance(2 * time.Hour)
		require.ErrorIs(t, g.Approve(ctx, w[0], "ops@acme", "late"), agent.ErrNotWaiting, "a late approval counts for nothing")
		_, err = task.Call(ctx, "3", refund, args, p.keyed, nil)
		var rej *agent.RejectedError
		require.ErrorAs(t, err, &rej)
		require.True(t, rej.TimedOut)
	})
	require.EqualValues(t, 1, p.calls.Load())
}

// A call whose answer was lost is reported uncertain when its provider takes no key,
// and not repeated until an operator settles it; with a key, it is made again with the
// same key and the provider deduplicates it.
func TestCall_LostAnswer(t *testing.T) {
	t.Parallel()
	g, b := setup(t, nil)
	p := &provider{pool: b.pool}
	task := g.Task("acme", "ticket-7")
	lose := faultpoint.With(context.Background(), func(context.Context, faultpoint.Point, any, error) faultpoint.Fault {
		return faultpoint.LoseAnswer
	})
	ctx := context.Background()

	_, err := task.Call(lose, "1", smtpSend, nil, p.plain, nil)
	var unc *agent.UncertainError
	require.ErrorAs(t, err, &unc)
	require.ErrorIs(t, err, faultpoint.ErrLostAnswer)
	for range 2 {
		_, err = task.Call(ctx, "1", smtpSend, nil, p.plain, nil)
		require.ErrorIs(t, err, agent.ErrUncertain, "a retry is not made")
	}
	require.EqualValues(t, 1, p.calls.Load())
	require.Equal(t, 1, effects(t, b.pool, unc.Call))

	require.NoError(t, g.Resolve(ctx, unc.Call, true, json.RawMessage(`{"id":"checked"}`)))
	res, err := task.Call(ctx, "1", smtpSend, nil, p.plain, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.JSONEq(t, `{"id":"checked"}`, string(res.Output))
	require.ErrorIs(t, g.Resolve(ctx, unc.Call, true, nil), agent.ErrNothingToResolve)

	t.Run("ResolvedNotDone", func(t *testing.T) {
		_, err := task.Call(lose, "2", smtpSend, nil, p.plain, nil)
		require.ErrorAs(t, err, &unc)
		_, err = b.pool.Exec(ctx, "DELETE FROM effects WHERE call = $1", string(unc.Call.Key)) // the provider never sent it
		require.NoError(t, err)
		require.NoError(t, g.Resolve(ctx, unc.Call, false, nil))
		_, err = task.Call(ctx, "2", smtpSend, nil, p.plain, nil)
		require.NoError(t, err)
		require.Equal(t, 1, effects(t, b.pool, unc.Call))
	})

	t.Run("Keyed", func(t *testing.T) {
		var keysSeen []string
		var redrives []bool
		fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
			keysSeen = append(keysSeen, string(inv.DownstreamKey))
			redrives = append(redrives, inv.Redrive)
			return p.keyed(ctx, inv)
		}
		_, err := task.Call(lose, "3", emailAPI, nil, fn, nil)
		require.Error(t, err)
		require.NotErrorIs(t, err, agent.ErrUncertain)
		res, err := task.Call(ctx, "3", emailAPI, nil, fn, nil)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Len(t, keysSeen, 2)
		require.Equal(t, keysSeen[0], keysSeen[1], "the call is made again with the same downstream key")
		require.Equal(t, []bool{false, true}, redrives)
		require.Equal(t, 1, effects(t, b.pool, res.Call))
	})
}

// A tool's hints let it skip the ledger only when the configuration trusts them, and
// never when it says it is destructive.
func TestHints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	search := agent.Tool{Name: "search", Hints: agent.Hints{ReadOnly: true}}
	liar := agent.Tool{Name: "wipe", Hints: agent.Hints{ReadOnly: true, Destructive: true}}
	for _, trust := range []bool{false, true} {
		name := map[bool]string{false: "Untrusted", true: "Trusted"}[trust]
		t.Run(name, func(t *testing.T) {
			g, b := setup(t, &agent.Config{TrustHints: trust})
			p := &provider{pool: b.pool}
			task := g.Task("acme", "ticket-8")
			for range 2 {
				res, err := task.Call(ctx, "1", search, nil, p.plain, nil)
				require.NoError(t, err)
				require.Equal(t, trust, res.Unguarded)
				res, err = task.Call(ctx, "2", liar, nil, p.plain, nil)
				require.NoError(t, err)
				require.False(t, res.Unguarded)
			}
			want := int64(2)
			if trust {
				want = 3
			}
			require.Equal(t, want, p.calls.Load())
		})
	}
}

// Two hundred random crash points across the three kinds of tool: after every
// retry, each call's effect is in PostgreSQL exactly once, or the call is reported
// uncertain with its effect there once.
func TestCall_CrashPoints(t *testing.T) {
	t.Parallel()
	g, b := setup(t, &agent.Config{CallLease: time.Hour})
	p := &provider{pool: b.pool}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const trials = 200
	uncertain := 0
	for i := range trials {
		kind := rng.IntN(3)
		fault := faultpoint.Fault(rng.IntN(3)) // None, Crash, LoseAnswer
		if kind == 2 && fault == faultpoint.LoseAnswer {
			fault = faultpoint.Crash // a local tool has no answer to lose: it commits or not
		}
		task := g.Task("acme", "crash-"+strconv.Itoa(i))
		args := json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`)
		call := func(ctx context.Context) (agent.Result, error) {
			switch kind {
			case 0:
				return task.Call(ctx, "1", emailAPI, args, p.keyed, nil)
			case 1:
				return task.Call(ctx, "1", smtpSend, args, p.plain, nil)
			default:
				return task.CallTx(ctx, "1", ticket, args, p.local, nil)
			}
		}
		struck := false
		fctx := faultpoint.With(context.Background(), func(_ context.Context, pt faultpoint.Point, _ any, _ error) faultpoint.Fault {
			if pt != faultpoint.AfterCall && pt != faultpoint.BeforeCommit {
				return faultpoint.None
			}
			struck = true
			return fault
		})
		res, err := call(fctx)
		for attempt := 0; err != nil && attempt < 3; attempt++ {
			if errors.Is(err, agent.ErrUncertain) {
				break
			}
			b.clock.Advance(time.Second) // a dead attempt's lease runs out
			res, err = call(context.Background())
		}
		ref, rerr := g.Ref("acme", task.ID, "1", []string{emailAPI.Name, smtpSend.Name, ticket.Name}[kind])
		require.NoError(t, rerr)
		n := effects(t, b.pool, ref)
		require.Equal(t, 1, n, "trial %d: kind %d, fault %d, struck %v, err %v", i, kind, fault, struck, err)
		if err != nil {
			require.ErrorIs(t, err, agent.ErrUncertain, "trial %d", i)
			require.Equal(t, 1, kind, "only a tool without a key is left uncertain")
			uncertain++
			continue
		}
		again, err := call(context.Background())
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, res.Output, again.Output)
	}
	t.Logf("%d trials, %d left uncertain", trials, uncertain)
}

// A call that replays renews the task's claim as a first run does: an agent whose calls
// all replay, such as one that took a task over, keeps its task.
func TestTask_ReplayRenewsClaim(t *testing.T) {
	t.Parallel()
	g, b := setup(t, &agent.Config{TaskLease: time.Minute})
	ctx := context.Background()
	p := &provider{pool: b.pool}
	task, err := g.ClaimTask(ctx, "acme", "ticket-9", nil)
	require.NoError(t, err)
	_, err = task.Call(ctx, "1", emailAPI, nil, p.keyed, nil)
	require.NoError(t, err)
	b.clock.Advance(40 * time.Second)
	res, err := task.Call(ctx, "1", emailAPI, nil, p.keyed, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	b.clock.Advance(40 * time.Second) // past the claim's first lease, within the renewed one
	_, err = g.ClaimTask(ctx, "acme", "ticket-9", nil)
	require.ErrorIs(t, err, ledger.ErrInProgress, "the replay renewed the claim")
	require.NoError(t, task.Finish(ctx, nil))
}

// Frozen calls are purged once their retention ran out, in batches, and not before;
// Purgeable counts them first.
func TestPurge(t *testing.T) {
	t.Parallel()
	g, b := setup(t, &agent.Config{Retention: time.Hour})
	ctx := context.Background()
	p := &provider{pool: b.pool}
	task := g.Task("acme", "ticket-10")
	for i := range 5 {
		_, err := task.Call(ctx, strconv.Itoa(i), smtpSend, nil, p.plain, nil)
		require.NoError(t, err)
	}
	res, err := g.Purge(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Deleted)
	n, err := g.Purgeable(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	b.clock.Advance(2 * time.Hour)
	n, err = g.Purgeable(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "what Purge would delete")
	res, err = g.Purge(ctx, &ledger.PurgeOpts{BatchSize: 2})
	require.NoError(t, err)
	require.EqualValues(t, 5, res.Deleted)
	require.Equal(t, 3, res.Batches)
	var left int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM agent_calls").Scan(&left))
	require.Zero(t, left)
}

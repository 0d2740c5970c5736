// Tests written against the contract of package agent (its documentation and
// docs/agents.md) alone: leases that lapse under a working owner, racing agents, crashes
// between a tool's effect and its record, changed arguments, approvals, hints, deadlines
// and hostile bytes. Each counts tool starts and effects, not rows.
package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

// rtEnv is what a red-team test works with: a guard, the clock its ledger and approvals
// share, a counter of tool starts and effects, and task "t1" of tenant "acme", not
// claimed.
type rtEnv struct {
	g     *agent.Guard
	clock *stubClock
	cnt   *rtCounter
	task  *agent.Task
}

// rtSetup is the package's setup, with a counter and a task.
func rtSetup(t testing.TB, cfg *agent.Config) rtEnv {
	t.Helper()
	g, b := setup(t, cfg)
	return rtEnv{g: g, clock: b.clock, cnt: newCounter(), task: g.Task("acme", "t1")}
}

// claim claims task "t1" of tenant "acme".
func (e rtEnv) claim(t testing.TB) *agent.Task {
	t.Helper()
	task, err := e.g.ClaimTask(context.Background(), "acme", "t1", nil)
	require.NoError(t, err)
	return task
}

// waitingOne returns the one call of tenant "acme" that waits for a decision.
func (e rtEnv) waitingOne(t testing.TB) agent.FrozenCall {
	t.Helper()
	w, err := e.g.Waiting(context.Background(), "acme", 10)
	require.NoError(t, err)
	require.Len(t, w, 1)
	return w[0]
}

// freeze calls the approval tool at step of task with args, which freezes the call for
// a decision, and returns the frozen call.
func (e rtEnv) freeze(t testing.TB, task *agent.Task, step string, args json.RawMessage) agent.FrozenCall {
	t.Helper()
	_, err := task.Call(context.Background(), step, approvalTool(), args, e.cnt.ok, nil)
	var pend *agent.ApprovalPendingError
	require.ErrorAs(t, err, &pend)
	return e.waitingOne(t)
}

// rtCounter counts starts of a tool function per step, and effects.
type rtCounter struct {
	mu      sync.Mutex
	starts  map[string]int
	effects map[string]int
	dkeys   map[string]map[string]bool
}

func newCounter() *rtCounter {
	return &rtCounter{starts: map[string]int{}, effects: map[string]int{}, dkeys: map[string]map[string]bool{}}
}

func (c *rtCounter) start(inv agent.Invocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts[inv.Call.Step]++
}

func (c *rtCounter) effect(inv agent.Invocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.effects[inv.Call.Step]++
	if c.dkeys[inv.Call.Step] == nil {
		c.dkeys[inv.Call.Step] = map[string]bool{}
	}
	c.dkeys[inv.Call.Step][string(inv.DownstreamKey)] = true
}

func (c *rtCounter) Starts(step string) int { c.mu.Lock(); defer c.mu.Unlock(); return c.starts[step] }
func (c *rtCounter) Effects(step string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.effects[step]
}

// actThenDie is a tool that acts and then loses its context before it answers, as an
// agent that dies after the effect does; seen, when not nil, receives its invocation.
func (c *rtCounter) actThenDie(cancel context.CancelFunc, seen *agent.Invocation) agent.ToolFunc {
	return func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		if seen != nil {
			*seen = inv
		}
		c.start(inv)
		c.effect(inv)
		cancel()
		return nil, ctx.Err()
	}
}

// ok is a tool that acts and answers.
func (c *rtCounter) ok(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
	c.start(inv)
	c.effect(inv)
	return json.RawMessage(`{"sent":` + fmt.Sprint(inv.Attempt) + `}`), nil
}

var (
	plainTool = agent.Tool{Name: "smtp"}
	keyedTool = agent.Tool{Name: "email", AcceptsKey: true}
)

// 1. A task lease lapses while its owner is inside a tool; another agent takes the task
// over; the owner comes back: its next calls, heartbeat and finish are refused, and no
// tool of it starts.
func TestRedteamStaleOwnerComesBack(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute})
	cnt := env.cnt
	a := env.claim(t)

	var b *agent.Task
	_, err := a.Call(ctx, "1", plainTool, json.RawMessage(`{"to":"x"}`), func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		env.clock.Advance(2 * time.Minute)
		var err error
		b, err = env.g.ClaimTask(ctx, "acme", "t1", nil)
		if err != nil {
			return nil, err
		}
		cnt.effect(inv)
		return json.RawMessage(`{"ok":true}`), nil
	}, nil)
	require.NotNil(t, b, "take-over failed")
	require.True(t, b.TakenOver)
	t.Logf("stale owner's in-flight call: err=%v", err)

	// The stale owner's next call must be refused before its tool starts.
	_, err = a.Call(ctx, "2", plainTool, json.RawMessage(`{"to":"y"}`), cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner)
	var se *agent.StaleOwnerError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 0, cnt.Starts("2"))
	_, err = a.CallTx(ctx, "3", plainTool, json.RawMessage(`{}`), func(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		return json.RawMessage(`{}`), nil
	}, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner)
	require.Equal(t, 0, cnt.Starts("3"))
	require.ErrorIs(t, a.Heartbeat(ctx), agent.ErrStaleOwner)
	require.ErrorIs(t, a.Finish(ctx, json.RawMessage(`{"by":"a"}`)), agent.ErrStaleOwner)

	// The new owner replays step 1 (or hears it in progress / uncertain), never runs it again.
	res, err := b.Call(ctx, "1", plainTool, json.RawMessage(`{"to":"x"}`), cnt.ok, nil)
	t.Logf("new owner step 1: res=%+v err=%v", res, err)
	require.Equal(t, 1, cnt.Starts("1"))
	require.Equal(t, 1, cnt.Effects("1"))
	res, err = b.Call(ctx, "2", plainTool, json.RawMessage(`{"to":"y"}`), cnt.ok, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.NoError(t, b.Finish(ctx, nil))
	require.Equal(t, 1, cnt.Starts("2"))
}

// 1b. The lease lapses and the task is taken over; the stale owner's Release must not
// free the new owner's claim.
func TestRedteamStaleOwnerRelease(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute})
	a := env.claim(t)
	env.clock.Advance(2 * time.Minute)
	b := env.claim(t)
	relErr := a.Release(ctx)
	t.Logf("stale release: %v", relErr)
	// A third agent must not get the task: b holds it.
	_, err := env.g.ClaimTask(ctx, "acme", "t1", nil)
	require.ErrorIs(t, err, ledger.ErrInProgress, "stale owner's Release freed the new owner's task")
	require.NoError(t, b.Heartbeat(ctx))
}

// 1c. The lease lapsed but nobody took over: the old owner comes back. Either it is
// refused, or it continues; the contract only fences after a take-over. Then finish.
// 2. Agents racing for one task: exactly one holds it at a time.
func TestRedteamRaceClaim(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	const n = 30
	var wins atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := env.g.ClaimTask(ctx, "acme", "race", nil)
			if err == nil {
				wins.Add(1)
				return
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, ledger.ErrInProgress)
	}
	require.Equal(t, int32(1), wins.Load())
}

// 2b. Randomized: agents claim four tasks, take them over after lapses, lose answers and
// change their minds; a plain tool starts at most once per call, a keyed tool sees one
// downstream key per call, and every effect of a call has the same arguments.
func TestRedteamRandomTakeovers(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute, CallLease: 30 * time.Second})
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var mu sync.Mutex
	starts := map[string]int{}
	keysSeen := map[string]map[string]bool{}
	argsSeen := map[string]map[string]bool{}
	var finished [4]atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(w)))
			for round := 0; round < 60; round++ {
				ti := rng.Intn(4)
				task, err := env.g.ClaimTask(ctx, "acme", fmt.Sprint("rt", ti), nil)
				if err != nil {
					if rng.Intn(3) == 0 {
						env.clock.Advance(time.Duration(rng.Intn(90)) * time.Second)
					}
					continue
				}
				ok := true
				for step := 1; step <= 5 && ok; step++ {
					s := fmt.Sprint(step)
					tool := plainTool
					if step%2 == 0 {
						tool = keyedTool
					}
					args := json.RawMessage(`{"step":` + s + `}`)
					if rng.Intn(5) == 0 {
						args = json.RawMessage(`{"step":` + s + `,"reworded":true}`)
					}
					_, err := task.Call(ctx, s, tool, args, func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
						id := fmt.Sprint(ti, "/", s)
						mu.Lock()
						starts[id]++
						if keysSeen[id] == nil {
							keysSeen[id], argsSeen[id] = map[string]bool{}, map[string]bool{}
						}
						keysSeen[id][string(inv.DownstreamKey)] = true
						argsSeen[id][string(inv.Args)] = true
						mu.Unlock()
						if rng.Intn(4) == 0 {
							env.clock.Advance(time.Duration(rng.Intn(90)) * time.Second)
						}
						if rng.Intn(5) == 0 {
							return nil, errors.New("answer lost")
						}
						return json.RawMessage(`{"ok":` + s + `}`), nil
					}, nil)
					if err != nil && !errors.Is(err, agent.ErrUncertain) && !errors.Is(err, agent.ErrArgumentsChanged) {
						ok = false
					}
				}
				if ok && task.Finish(ctx, nil) == nil {
					finished[ti].Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for ti := range finished {
		require.LessOrEqual(t, finished[ti].Load(), int32(1), "task %d finished twice", ti)
	}
	for id, n := range starts {
		var step int
		fmt.Sscanf(id[strings.Index(id, "/")+1:], "%d", &step)
		if step%2 == 1 {
			require.LessOrEqual(t, n, 1, "plain tool started %d times at %s", n, id)
		}
		require.Len(t, keysSeen[id], 1, "several downstream keys at %s", id)
		require.Len(t, argsSeen[id], 1, "a call at %s acted with several argument sets", id)
	}
}

// 3. A crash between the tool's effect and its record: the context is cancelled inside
// the tool after the effect. A plain tool is reported uncertain and does not start again;
// a keyed tool is redriven with the same downstream key.
func TestRedteamCrashAfterEffectPlain(t *testing.T) {
	env := rtSetup(t, &agent.Config{CallLease: 30 * time.Second})
	cnt, task := env.cnt, env.task
	ctx, cancel := context.WithCancel(context.Background())
	_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{"to":"x"}`), cnt.actThenDie(cancel, nil), nil)
	t.Logf("crashed call heard: %v", err)
	require.Error(t, err)
	for _, adv := range []time.Duration{0, time.Minute} {
		env.clock.Advance(adv)
		_, err = task.Call(context.Background(), "1", plainTool, json.RawMessage(`{"to":"x"}`), cnt.ok, nil)
		t.Logf("retry after %v: %v", adv, err)
		require.Error(t, err)
	}
	require.ErrorIs(t, err, agent.ErrUncertain)
	require.Equal(t, 1, cnt.Starts("1"))
}

func TestRedteamCrashAfterEffectKeyed(t *testing.T) {
	env := rtSetup(t, &agent.Config{CallLease: 30 * time.Second})
	cnt, task := env.cnt, env.task
	ctx, cancel := context.WithCancel(context.Background())
	var first agent.Invocation
	_, err := task.Call(ctx, "1", keyedTool, json.RawMessage(`{"to":"x"}`), cnt.actThenDie(cancel, &first), nil)
	require.Error(t, err)
	env.clock.Advance(time.Minute)
	var second agent.Invocation
	res, err := task.Call(context.Background(), "1", keyedTool, json.RawMessage(`{"to":"x"}`), func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		second = inv
		return cnt.ok(c, inv)
	}, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, first.DownstreamKey, second.DownstreamKey)
	require.True(t, second.Redrive)
	res, err = task.Call(context.Background(), "1", keyedTool, json.RawMessage(`{"to":"x"}`), cnt.ok, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 2, cnt.Starts("1"))
}

// 4. A retry with changed arguments after a crash: refused with both sets, never started,
// for both kinds of tool, before and after the call's lease ran out.
func TestRedteamChangedArgsAfterCrash(t *testing.T) {
	for _, tool := range []agent.Tool{plainTool, keyedTool} {
		t.Run(tool.Name, func(t *testing.T) {
			env := rtSetup(t, &agent.Config{CallLease: 30 * time.Second})
			cnt, task := env.cnt, env.task
			ctx, cancel := context.WithCancel(context.Background())
			_, err := task.Call(ctx, "1", tool, json.RawMessage(`{"to":"x","n":1}`), cnt.actThenDie(cancel, nil), nil)
			require.Error(t, err)
			for _, adv := range []time.Duration{0, time.Minute} {
				env.clock.Advance(adv)
				_, err = task.Call(context.Background(), "1", tool, json.RawMessage(`{"to":"y","n":1}`), cnt.ok, nil)
				t.Logf("changed retry after %v: %v", adv, err)
				var ch *agent.ArgumentsChangedError
				require.ErrorAs(t, err, &ch, "after %v", adv)
				require.JSONEq(t, `{"to":"x","n":1}`, string(ch.Stored))
				require.JSONEq(t, `{"to":"y","n":1}`, string(ch.New))
				require.Equal(t, 1, cnt.Starts("1"))
			}
		})
	}
}

// 4b. Same arguments in another member order and whitespace are the same call.
func TestRedteamCanonicalArgsReplay(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{"a":1,"b":[1,2]}`), cnt.ok, nil)
	require.NoError(t, err)
	res, err := task.Call(ctx, "1", plainTool, json.RawMessage(" {\"b\" : [1,2], \"a\":1.0}\n"), cnt.ok, nil)
	t.Logf("reordered: %+v %v", res, err)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 1, cnt.Starts("1"))
}

// 5. Approval, then changed arguments.
func approvalTool() agent.Tool { return agent.Tool{Name: "refund", NeedsApproval: true} }

func TestRedteamApprovalThenChangedArgs(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	args := json.RawMessage(`{"amount":120}`)
	env.freeze(t, task, "1", args)
	// Changed before approval: refused, not a second frozen call.
	_, err := task.Call(ctx, "1", approvalTool(), json.RawMessage(`{"amount":900}`), cnt.ok, nil)
	t.Logf("changed while pending: %v", err)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)
	w := []agent.FrozenCall{env.waitingOne(t)}
	require.JSONEq(t, `{"amount":120}`, string(w[0].Args))
	// A forged frozen call with other args but the same ref must not be approvable.
	forged := w[0]
	forged.Args = json.RawMessage(`{"amount":900}`)
	err = env.g.Approve(ctx, forged, "eve", "forged args")
	t.Logf("approve with forged args, real fingerprint: %v", err)
	if err != nil {
		require.NoError(t, env.g.Approve(ctx, w[0], "ops", "ok"))
	}
	_, err = task.Call(ctx, "1", approvalTool(), json.RawMessage(`{"amount":900}`), cnt.ok, nil)
	var ch *agent.ArgumentsChangedError
	require.ErrorAs(t, err, &ch)
	require.Equal(t, 0, cnt.Starts("1"))
	res, err := task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	res, err = task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 1, cnt.Starts("1"))
	// Approving again is refused.
	require.ErrorIs(t, env.g.Approve(ctx, w[0], "ops", "again"), agent.ErrNotWaiting)
}

// 6. Approval timeout counts as rejection.
func TestRedteamApprovalTimeout(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{ApprovalTimeout: time.Hour})
	cnt, task := env.cnt, env.task
	args := json.RawMessage(`{"amount":120}`)
	f := env.freeze(t, task, "1", args)
	env.clock.Advance(2 * time.Hour)
	err := env.g.Approve(ctx, f, "ops", "late")
	t.Logf("late approve: %v", err)
	require.Error(t, err)
	_, err = task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	var rej *agent.RejectedError
	require.ErrorAs(t, err, &rej)
	require.True(t, rej.TimedOut)
	require.Equal(t, 0, cnt.Starts("1"))
	w, err := env.g.Waiting(ctx, "acme", 10)
	require.NoError(t, err)
	require.Empty(t, w, "a timed-out call is still listed as waiting")
}

// 6b. The timeout passes, nobody calls again, and someone approves: must still be refused.
// 7. Concurrent approvals and rejections: one decision wins; then concurrent calls start
// the tool at most once.
func TestRedteamConcurrentApprovals(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	args := json.RawMessage(`{"amount":120}`)
	w := []agent.FrozenCall{env.freeze(t, task, "1", args)}
	var approved, rejected atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var err error
			if i%4 == 0 {
				err = env.g.Reject(ctx, w[0], "ops", "no")
				if err == nil {
					rejected.Add(1)
				}
			} else {
				err = env.g.Approve(ctx, w[0], "ops", "yes")
				if err == nil {
					approved.Add(1)
				}
			}
			if err != nil && !errors.Is(err, agent.ErrNotWaiting) {
				t.Errorf("decision: unexpected error %v", err)
			}
		}(i)
	}
	wg.Wait()
	require.Equal(t, int32(1), approved.Load()+rejected.Load())
	var ran, replayed, refused atomic.Int32
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := task.Call(ctx, "1", approvalTool(), args, cnt.ok, &agent.CallOpts{Wait: 10 * time.Second})
			switch {
			case err == nil && res.Replayed:
				replayed.Add(1)
			case err == nil:
				ran.Add(1)
			case errors.Is(err, agent.ErrRejected):
				refused.Add(1)
			default:
				t.Errorf("call: %v", err)
			}
		}()
	}
	wg.Wait()
	if approved.Load() == 1 {
		require.Equal(t, int32(1), ran.Load())
		require.Equal(t, 1, cnt.Starts("1"))
	} else {
		require.Equal(t, int32(20), refused.Load())
		require.Equal(t, 0, cnt.Starts("1"))
	}
}

// 8. A read-only hint on a destructive tool is not trusted.
func TestRedteamReadOnlyHintDestructive(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TrustHints: true})
	cnt, task := env.cnt, env.task
	tool := agent.Tool{Name: "wipe", Hints: agent.Hints{ReadOnly: true, Idempotent: true, Destructive: true}}
	res, err := task.Call(ctx, "1", tool, json.RawMessage(`{}`), cnt.ok, nil)
	require.NoError(t, err)
	require.False(t, res.Unguarded)
	res, err = task.Call(ctx, "1", tool, json.RawMessage(`{}`), cnt.ok, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	_, err = task.Call(ctx, "1", tool, json.RawMessage(`{"all":true}`), cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)
	require.Equal(t, 1, cnt.Starts("1"))
}

// 8b. Without TrustHints, a read-only tool is still guarded.
// 8c. A tool that needs approval and says it only reads: trusting the hint must not skip
// the person's decision.
func TestRedteamReadOnlyHintNeedsApproval(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TrustHints: true})
	cnt, task := env.cnt, env.task
	tool := agent.Tool{Name: "refund", NeedsApproval: true, Hints: agent.Hints{ReadOnly: true}}
	res, err := task.Call(ctx, "1", tool, json.RawMessage(`{"amount":500}`), cnt.ok, nil)
	t.Logf("read-only + needs approval: res=%+v err=%v", res, err)
	require.ErrorIs(t, err, agent.ErrApprovalPending, "a read-only hint skipped the approval")
	require.Equal(t, 0, cnt.Starts("1"))
}

// 9. A context deadline shorter than the wait for a duplicate in flight.
func TestRedteamDeadlineShorterThanWait(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
			cnt.start(inv)
			close(inside)
			<-release
			cnt.effect(inv)
			return json.RawMessage(`{"ok":1}`), nil
		}, nil)
		done <- err
	}()
	<-inside
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := task.Call(short, "1", plainTool, json.RawMessage(`{}`), cnt.ok, &agent.CallOpts{Wait: time.Hour})
		second <- err
	}()
	select {
	case err := <-second:
		t.Logf("short deadline heard: %v", err)
		require.Error(t, err)
		require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ledger.ErrInProgress), "err %v", err)
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("a call with a short deadline waited past it")
	}
	close(release)
	require.NoError(t, <-done)
	res, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, 1, cnt.Starts("1"))
}

// 9b. The waiting duplicate replays once the first finishes.
// 10. Hostile bytes in step, tool and arguments: a clear error, the tool never starts,
// and nothing is stored (a later well-formed call at a sane place runs normally).
func TestRedteamHostileInput(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	cases := []struct {
		name, step, tool string
		args             json.RawMessage
	}{
		{"nul in step", "1\x00", "smtp", json.RawMessage(`{}`)},
		{"nul in tool", "1", "sm\x00tp", json.RawMessage(`{}`)},
		{"nul escape in args", "1", "smtp", json.RawMessage(`{"to":"a\u0000b"}`)},
		{"raw nul in args", "1", "smtp", json.RawMessage("{\"to\":\"a\x00b\"}")},
		{"invalid utf8 step", "\xff\xfe", "smtp", json.RawMessage(`{}`)},
		{"invalid json", "1", "smtp", json.RawMessage(`{"to":`)},
		{"trailing garbage", "1", "smtp", json.RawMessage(`{} {}`)},
		{"deep nesting", "1", "smtp", json.RawMessage(deep)},
		{"huge step", strings.Repeat("s", 100000), "smtp", json.RawMessage(`{}`)},
		{"empty step", "", "smtp", json.RawMessage(`{}`)},
		{"empty tool", "1", "", json.RawMessage(`{}`)},
		{"lone surrogate escape", "1", "smtp", json.RawMessage(`{"to":"\ud800"}`)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cnt := newCounter()
			task := env.g.Task("acme", fmt.Sprintf("h%d", i))
			_, err := task.Call(ctx, c.step, agent.Tool{Name: c.tool}, c.args, cnt.ok, nil)
			msg := fmt.Sprint(err)
			if len(msg) > 300 {
				msg = msg[:300]
			}
			t.Logf("%s: starts=%d err=%s", c.name, cnt.Starts(c.step), msg)
			if err == nil {
				// Accepted: then it must replay, not run again.
				res, err := task.Call(ctx, c.step, agent.Tool{Name: c.tool}, c.args, cnt.ok, nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, 1, cnt.Starts(c.step))
				return
			}
			require.Equal(t, 0, cnt.Starts(c.step), "the tool started although the call was refused: %s", msg)
			var pe interface{ SQLState() string }
			require.False(t, errors.As(err, &pe), "a raw database error reached the caller: %s", msg)
			// Nothing stored: the same task's sane call at step "ok" works.
			_, err = task.Call(ctx, "ok", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
			require.NoError(t, err)
		})
	}
}

// 10b. Hostile output: the tool acted and returned what cannot be stored (NUL escape, too
// large). The effect happened: the caller must not hear a clean refusal that a retry
// repeats.
// 10c. A plain tool acted and its output is over the ledger's body limit: the caller must
// hear that the call may have happened, and no retry may start the tool again.
func TestRedteamOutputTooLargeAfterEffect(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{CallLease: 30 * time.Second})
	cnt, task := env.cnt, env.task
	fn := func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		cnt.effect(inv)
		return json.RawMessage(`{"v":"` + strings.Repeat("a", 2<<20) + `"}`), nil
	}
	_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), fn, nil)
	t.Logf("first heard: %.200v", err)
	firstUncertain := errors.Is(err, agent.ErrUncertain)
	env.clock.Advance(time.Minute)
	_, err = task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), fn, nil)
	t.Logf("retry after the call lease heard: %.200v", err)
	require.Equal(t, 1, cnt.Starts("1"), "the tool ran again")
	require.ErrorIs(t, err, agent.ErrUncertain)
	require.True(t, firstUncertain, "the tool acted, and the caller heard a refusal that says nothing was stored")
}

// 10d. Hostile bytes in the tenant and the task ID.
func TestRedteamHostileTaskNames(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt := env.cnt
	var pe interface{ SQLState() string }
	for _, c := range []struct{ tenant, id string }{{"acme", "t\x00"}, {"ac\x00me", "t"}, {"acme", "\xff"}} {
		task, err := env.g.ClaimTask(ctx, c.tenant, c.id, nil)
		t.Logf("ClaimTask(%q,%q): %v", c.tenant, c.id, err)
		require.False(t, errors.As(err, &pe), "a raw database error reached the caller: %v", err)
		if err == nil {
			_, err = task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
			t.Logf("claimed.Call: %v", err)
			require.False(t, errors.As(err, &pe), "a raw database error reached the caller: %v", err)
			err = task.Finish(ctx, nil)
			t.Logf("claimed.Finish: %v", err)
			require.False(t, errors.As(err, &pe), "a raw database error reached the caller: %v", err)
		}
		_, err = env.g.Task(c.tenant, c.id).Call(ctx, "2", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
		t.Logf("Task(%q,%q).Call: %v", c.tenant, c.id, err)
		require.False(t, errors.As(err, &pe), "a raw database error reached the caller: %v", err)
	}
}

// 1d. The owner's lease lapses, another agent takes over and releases: the first owner's
// token is still stale.
func TestRedteamStaleOwnerAfterTakeoverRelease(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute})
	cnt := env.cnt
	a := env.claim(t)
	env.clock.Advance(2 * time.Minute)
	b := env.claim(t)
	require.NoError(t, b.Release(ctx))
	hb := a.Heartbeat(ctx)
	_, callErr := a.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
	fin := a.Finish(ctx, nil)
	t.Logf("stale owner after the new owner released: heartbeat=%v call=%v finish=%v", hb, callErr, fin)
	require.ErrorIs(t, hb, agent.ErrStaleOwner)
	require.ErrorIs(t, callErr, agent.ErrStaleOwner)
	require.ErrorIs(t, fin, agent.ErrStaleOwner)
	require.Equal(t, 0, cnt.Starts("1"))
}

// 1e. After Finish, the owner's calls do not start tools, and a new claim is refused.
// 1f. The stale owner's call is in flight when its task and call leases both lapse; the
// new owner reaches the same step: a plain tool is reported uncertain, never run twice.
func TestRedteamTakeoverDuringPlainCall(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute, CallLease: time.Minute})
	cnt := env.cnt
	a := env.claim(t)
	var bErr error
	_, aErr := a.Call(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		cnt.effect(inv)
		env.clock.Advance(5 * time.Minute)
		b, err := env.g.ClaimTask(ctx, "acme", "t1", nil)
		if err != nil {
			return nil, err
		}
		_, bErr = b.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
		return json.RawMessage(`{"ok":1}`), nil
	}, nil)
	t.Logf("old owner heard %v; new owner heard %v", aErr, bErr)
	require.Equal(t, 1, cnt.Starts("1"))
	require.ErrorIs(t, bErr, agent.ErrUncertain)
}

// An approval is bound to its call's place: the same arguments at another step need a new
// approval, and an agent that takes the task over runs the approved call once.
func TestRedteamApprovalBoundToPlace(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute})
	cnt := env.cnt
	a := env.claim(t)
	args := json.RawMessage(`{"amount":120}`)
	require.NoError(t, env.g.Approve(ctx, env.freeze(t, a, "1", args), "ops", "ok"))
	env.clock.Advance(2 * time.Minute)
	b := env.claim(t)
	_, err := a.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner)
	res, err := b.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	_, err = b.Call(ctx, "2", approvalTool(), args, cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrApprovalPending, "an approval at step 1 let step 2 run")
	require.Equal(t, 1, cnt.Starts("1"))
	require.Equal(t, 0, cnt.Starts("2"))
}

// An operator's Resolve on a call still in flight must not release its key: the call is
// not uncertain, and releasing it would let a retry start a tool without a key twice.
func TestRedteamResolveInFlight(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	inside := make(chan agent.Invocation)
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
			cnt.start(inv)
			inside <- inv
			<-release
			cnt.effect(inv)
			return json.RawMessage(`{"ok":1}`), nil
		}, nil)
		done <- err
	}()
	inv := <-inside
	err := env.g.Resolve(ctx, inv.Call, false, nil)
	t.Logf("resolve in flight: %v", err)
	_, err2 := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
	t.Logf("retry after resolve: %v", err2)
	close(release)
	require.NoError(t, <-done)
	require.True(t, errors.Is(err, agent.ErrNothingToResolve) || errors.Is(err, ledger.ErrInProgress), "resolve in flight: %v", err)
	require.Equal(t, 1, cnt.Starts("1"))
}

// Resolve of an uncertain call: concurrent operators, one says it happened, one says it
// did not; afterwards every caller hears one story and the tool starts at most once more.
func TestRedteamResolveRace(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		cnt.effect(inv)
		return nil, errors.New("connection reset")
	}, nil)
	var unc *agent.UncertainError
	require.ErrorAs(t, err, &unc)
	ref := unc.Call
	var wg sync.WaitGroup
	var oks atomic.Int32
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := env.g.Resolve(ctx, ref, i%2 == 0, json.RawMessage(`{"resolved":true}`))
			if err == nil {
				oks.Add(1)
			} else if !errors.Is(err, agent.ErrNothingToResolve) && !errors.Is(err, ledger.ErrInProgress) {
				t.Errorf("resolve: %v", err)
			}
		}(i)
	}
	wg.Wait()
	require.Equal(t, int32(1), oks.Load(), "several resolutions of one call were accepted")
	res, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
	require.NoError(t, err)
	res2, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{}`), cnt.ok, nil)
	require.NoError(t, err)
	require.True(t, res2.Replayed)
	require.JSONEq(t, string(res.Output), string(res2.Output))
	require.LessOrEqual(t, cnt.Starts("1"), 2)
}

// A definitive failure is stored and replayed; NotApplied releases the key; changed
// arguments after either are refused or run afresh as the contract says.
func TestRedteamDefinitiveAndNotApplied(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	def := func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		return nil, ledger.Definitive("card_declined", "declined")
	}
	_, err1 := task.Call(ctx, "1", plainTool, json.RawMessage(`{"n":1}`), def, nil)
	_, err2 := task.Call(ctx, "1", plainTool, json.RawMessage(`{"n":1}`), def, nil)
	t.Logf("definitive: %v / %v", err1, err2)
	var d1, d2 *ledger.DefinitiveError
	require.ErrorAs(t, err1, &d1)
	require.ErrorAs(t, err2, &d2)
	require.Equal(t, 1, cnt.Starts("1"))
	_, err := task.Call(ctx, "1", plainTool, json.RawMessage(`{"n":2}`), def, nil)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)
	require.Equal(t, 1, cnt.Starts("1"))

	na := func(c context.Context, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		return nil, ledger.NotApplied(errors.New("dns failure"))
	}
	_, err = task.Call(ctx, "2", plainTool, json.RawMessage(`{"n":1}`), na, nil)
	require.Error(t, err)
	res, err := task.Call(ctx, "2", plainTool, json.RawMessage(`{"n":1}`), cnt.ok, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 2, cnt.Starts("2"))
	require.Equal(t, 1, cnt.Effects("2"))
}

// A stale owner inside CallTx: its lease lapses while its transaction is open and another
// agent tries to take the task over. The take-over waits for the transaction; the call's
// effect is committed once, by one owner, and the other replays it.
func TestRedteamStaleOwnerInsideCallTx(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, &agent.Config{TaskLease: time.Minute})
	cnt := env.cnt
	a := env.claim(t)
	type claim struct {
		task *agent.Task
		err  error
	}
	got := make(chan claim, 1)
	var bDuring bool
	_, aErr := a.CallTx(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
		cnt.start(inv)
		env.clock.Advance(2 * time.Minute)
		go func() {
			b, err := env.g.ClaimTask(ctx, "acme", "t1", nil)
			got <- claim{b, err}
		}()
		select {
		case r := <-got:
			bDuring = true
			got <- r
		case <-time.After(3 * time.Second):
			// The take-over waits on this transaction.
		}
		cnt.effect(inv)
		return json.RawMessage(`{"ok":1}`), nil
	}, nil)
	var r claim
	select {
	case r = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the take-over never returned")
	}
	t.Logf("A's CallTx heard %v; B's claim (during A's tx: %v) heard %v", aErr, bDuring, r.err)
	if r.err == nil {
		// B owns the task. If A's transaction committed, it did so before the take-over,
		// and B's call at the same step replays it.
		res, err := r.task.CallTx(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
			cnt.start(inv)
			cnt.effect(inv)
			return json.RawMessage(`{"ok":2}`), nil
		}, nil)
		require.NoError(t, err)
		t.Logf("B's call: %+v", res)
		require.Equal(t, aErr == nil, res.Replayed)
		require.Equal(t, 1, cnt.Effects("1"))
	} else {
		require.NoError(t, aErr)
		require.ErrorIs(t, r.err, ledger.ErrInProgress)
	}
}

// Randomized deadlines shorter than a call: whatever instant the context ends at, a tool
// that never started is never reported uncertain afterwards, and one that started is
// never started again.
func TestRedteamRandomDeadlines(t *testing.T) {
	env := rtSetup(t, &agent.Config{CallLease: 30 * time.Second})
	cnt, task := env.cnt, env.task
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	var falseUncertain, repeated, untyped []string
	for i := 0; i < 80; i++ {
		s := fmt.Sprint(i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.Intn(4000))*time.Microsecond)
		_, err1 := task.Call(ctx, s, plainTool, json.RawMessage(`{}`), cnt.ok, nil)
		cancel()
		started := cnt.Starts(s)
		env.clock.Advance(time.Minute)
		_, err2 := task.Call(context.Background(), s, plainTool, json.RawMessage(`{}`), cnt.ok, nil)
		if started == 0 && errors.Is(err2, agent.ErrUncertain) {
			falseUncertain = append(falseUncertain, fmt.Sprintf("step %s: first heard %v (outcome unknown: %v)", s, err1, errors.Is(err1, ledger.ErrOutcomeUnknown)))
		}
		if cnt.Starts(s) > 1 {
			repeated = append(repeated, s)
		}
		if started == 1 && err1 != nil && !errors.Is(err1, agent.ErrUncertain) && !errors.Is(err1, ledger.ErrOutcomeUnknown) {
			untyped = append(untyped, fmt.Sprintf("step %s: heard %v, then %v", s, err1, err2))
		}
	}
	require.Empty(t, repeated, "a tool without a key started twice")
	require.Empty(t, untyped, "a tool that started was reported with an error that says neither uncertain nor unknown")
	require.Empty(t, falseUncertain, "calls whose tool never started were reported uncertain")
}

// Finish's answer lost to a short deadline: the owner retries Finish, as the lost
// answer's error advises ("call again ... which replays the result if it committed").
// Nobody else took the task over, so the retry must not say another agent owns it.
func TestRedteamFinishRetry(t *testing.T) {
	env := rtSetup(t, nil)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	var lies []string
	for i := 0; i < 150; i++ {
		id := fmt.Sprint("f", i)
		a, err := env.g.ClaimTask(context.Background(), "acme", id, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.Intn(4000))*time.Microsecond)
		err1 := a.Finish(ctx, json.RawMessage(`{"done":true}`))
		cancel()
		err2 := a.Finish(context.Background(), json.RawMessage(`{"done":true}`))
		if err1 != nil && errors.Is(err2, agent.ErrStaleOwner) {
			lies = append(lies, fmt.Sprintf("%s: first %v, retry %v", id, err1, err2))
		}
		_, err = env.g.ClaimTask(context.Background(), "acme", id, nil)
		require.ErrorIs(t, err, agent.ErrTaskDone, "%s: first %v, retry %v", id, err1, err2)
	}
	require.Empty(t, lies, "an owner whose task nobody took over was told another agent owns it")
}

// Twenty concurrent CallTx of one step: the database write commits once.
func TestRedteamConcurrentCallTx(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	var wg sync.WaitGroup
	var ran, replayed atomic.Int32
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := task.CallTx(ctx, "1", plainTool, json.RawMessage(`{}`), func(c context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
				cnt.start(inv)
				if _, err := tx.Exec(c, `SELECT 1`); err != nil {
					return nil, err
				}
				cnt.effect(inv)
				return json.RawMessage(`{"ok":1}`), nil
			}, &agent.CallOpts{Wait: 20 * time.Second})
			switch {
			case err != nil:
				t.Errorf("CallTx: %v", err)
			case res.Replayed:
				replayed.Add(1)
			default:
				ran.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), ran.Load())
	require.Equal(t, int32(19), replayed.Load())
	require.Equal(t, 1, cnt.Starts("1"))
}

// A rejected call stays rejected, its decision is reported, other arguments are refused,
// and another tenant neither sees nor decides it.
func TestRedteamRejectAndTenants(t *testing.T) {
	ctx := context.Background()
	env := rtSetup(t, nil)
	cnt, task := env.cnt, env.task
	args := json.RawMessage(`{"amount":300}`)
	w := []agent.FrozenCall{env.freeze(t, task, "1", args)}
	other, err := env.g.Waiting(ctx, "evil", 10)
	require.NoError(t, err)
	require.Empty(t, other)
	forged := w[0]
	forged.Call.Tenant = "evil"
	err = env.g.Approve(ctx, forged, "eve", "other tenant")
	t.Logf("approve with another tenant: %v", err)
	require.Error(t, err)
	require.NoError(t, env.g.Reject(ctx, w[0], "ops", "too much"))
	for i := 0; i < 2; i++ {
		_, err = task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
		var rej *agent.RejectedError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, "ops", rej.By)
		require.False(t, rej.TimedOut)
	}
	_, err = task.Call(ctx, "1", approvalTool(), json.RawMessage(`{"amount":100}`), cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrArgumentsChanged)
	require.ErrorIs(t, env.g.Approve(ctx, w[0], "ops", "changed my mind"), agent.ErrNotWaiting)
	require.Equal(t, 0, cnt.Starts("1"))
}

// A purge while a call waits for approval, with a retention shorter than the approval
// timeout: the call must not run without a person's decision afterwards.
func TestRedteamPurgeWhilePending(t *testing.T) {
	ctx := context.Background()
	g, b := setupLedger(t, &ledger.Config{Retention: time.Hour}, &agent.Config{Retention: time.Hour, ApprovalTimeout: 24 * time.Hour})
	clk, l := b.clock, b.l
	cnt := newCounter()
	task := g.Task("acme", "t1")
	args := json.RawMessage(`{"amount":500}`)
	_, err := task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	require.ErrorIs(t, err, agent.ErrApprovalPending)
	clk.Advance(2 * time.Hour)
	pr, err := g.Purge(ctx, nil)
	t.Logf("agent purge: %+v %v", pr, err)
	require.NoError(t, err)
	lr, err := l.Purge(ctx, nil)
	t.Logf("ledger purge: %+v %v", lr, err)
	require.NoError(t, err)
	res, err := task.Call(ctx, "1", approvalTool(), args, cnt.ok, nil)
	t.Logf("after purge: %+v %v", res, err)
	require.Equal(t, 0, cnt.Starts("1"), "a call that needs approval ran without one after a purge")
	_, err = task.Call(ctx, "1", approvalTool(), json.RawMessage(`{"amount":5000}`), cnt.ok, nil)
	t.Logf("changed after purge: %v", err)
	require.Equal(t, 0, cnt.Starts("1"))
}

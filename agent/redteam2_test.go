// Tests of the guard's lost answers and leases, written against the contract of package
// agent (its documentation, docs/agents.md and docs/ledger.md's "Lost answers") alone.
// Each case asks what the caller heard and whether it was true: it counts the starts of
// the tool function and reads the call's record through the ledger's public API.
package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

const (
	// rt2CallLease is the call lease of the guards of these tests, and rt2Lapse a move of
	// the clock that outlives it.
	rt2CallLease = 30 * time.Second
	rt2Lapse     = time.Minute
)

// rt2Counter counts the starts of a tool function per call and keeps each invocation.
// Its output names the start, so a second run of a call hands back another output.
type rt2Counter struct {
	mu     sync.Mutex
	starts map[string]int
	invs   map[string][]agent.Invocation
	// during, when set, runs inside the tool after the start is counted.
	during func(inv agent.Invocation)
	// big, when set, makes the output of the first start of a call this many bytes long.
	big int
}

func newRT2Counter() *rt2Counter {
	return &rt2Counter{starts: map[string]int{}, invs: map[string][]agent.Invocation{}}
}

func (c *rt2Counter) fn(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
	c.mu.Lock()
	c.starts[string(inv.Call.Key)]++
	n := c.starts[string(inv.Call.Key)]
	c.invs[string(inv.Call.Key)] = append(c.invs[string(inv.Call.Key)], inv)
	during, big := c.during, c.big
	c.mu.Unlock()
	if during != nil {
		during(inv)
	}
	if big > 0 && n == 1 {
		return json.RawMessage(`{"pad":"` + strings.Repeat("a", big) + `"}`), nil
	}
	return rt2OutputOf(inv, n), nil
}

// rt2OutputOf is the output of the tool's n-th start of the invocation's call.
func rt2OutputOf(inv agent.Invocation, n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"step":%q,"start":%d}`, inv.Call.Step, n))
}

// rt2JSONEq reports whether a and b hold equal JSON values.
func rt2JSONEq(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func (c *rt2Counter) setDuring(f func(inv agent.Invocation)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.during = f
}

func (c *rt2Counter) Starts(ref agent.CallRef) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.starts[string(ref.Key)]
}

func (c *rt2Counter) Invs(ref agent.CallRef) []agent.Invocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]agent.Invocation(nil), c.invs[string(ref.Key)]...)
}

// rt2Env holds two processes' views of one schema: g, whose connections pass through
// a fault proxy, and other, on a pool of its own, with a clock they share.
type rt2Env struct {
	b     *bundle
	g     *agent.Guard
	other *agent.Guard
	px    *faultproxy.Proxy
	cnt   *rt2Counter
}

func rt2Setup(t testing.TB, lcfg *ledger.Config) rt2Env {
	t.Helper()
	return rt2SetupLease(t, lcfg, time.Hour)
}

// rt2SetupLease is rt2Setup with the guards' task lease.
func rt2SetupLease(t testing.TB, lcfg *ledger.Config, taskLease time.Duration) rt2Env {
	t.Helper()
	cfg := &agent.Config{CallLease: rt2CallLease, TaskLease: taskLease}
	other, b := setupLedger(t, lcfg, cfg)
	g, px := b.lossy(t, faultproxy.Plan{Seed: 1, CommitLost: 1}, cfg)
	return rt2Env{b: b, g: g, other: other, px: px, cnt: newRT2Counter()}
}

func (e rt2Env) ref(t testing.TB, task, step string, tool agent.Tool) agent.CallRef {
	t.Helper()
	ref, err := e.g.Ref("acme", task, step, tool.Name)
	require.NoError(t, err)
	return ref
}

// record reads the call's record, or nil when there is none.
func (e rt2Env) record(t testing.TB, ref agent.CallRef) *ledger.Record {
	t.Helper()
	rec, err := e.b.l.Get(context.Background(), keys.Scope{Tenant: ref.Tenant, Operation: agent.OperationTool}, ref.Key)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return rec
}

// loseClaim makes the call with the answer of its first COMMIT lost, and checks that
// the caller heard an outcome-unknown error and the tool did not start.
func (e rt2Env) loseClaim(t testing.TB, task *agent.Task, step string, tool agent.Tool, args json.RawMessage) {
	t.Helper()
	before := e.px.Count(faultproxy.CommitLost)
	e.px.SetEnabled(true)
	_, err := task.Call(context.Background(), step, tool, args, e.cnt.fn, nil)
	e.px.SetEnabled(false)
	require.Equal(t, before+1, e.px.Count(faultproxy.CommitLost), "the claim's COMMIT went through the proxy")
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, agent.ErrUncertain)
	require.Zero(t, e.cnt.Starts(e.ref(t, task.ID, step, tool)), "the tool started although its claim's answer was lost")
}

var rt2Args = json.RawMessage(`{"to":"a@example.com"}`)

// A claim's commit answer is lost; the call is retried by the same task, by another
// value of the same task in the same process, and by another process, before and after
// the call's lease lapses. A call that never started runs once when the same process
// retries it, as its first attempt; another process waits while the lease is live and,
// after it, cannot know: a tool without a key is reported uncertain and never started,
// one with a key is made with its downstream key.
func TestRedteam2LostClaimRetriedBy(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, mode := range []string{"SameTask", "SameTaskLapsed", "NewTaskValue", "NewTaskValueLapsed", "OtherBeforeLapse", "OtherAfterLapse"} {
			t.Run(tool.Name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt2Setup(t, nil)
				task := e.g.Task("acme", "lost")
				ref := e.ref(t, "lost", "1", tool)
				e.loseClaim(t, task, "1", tool, rt2Args)
				otherTask := e.other.Task("acme", "lost")

				sameProcess := func(retry *agent.Task) json.RawMessage {
					res, err := retry.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.NoError(t, err, "a call that never started, retried by the process that lost its claim's answer")
					require.False(t, res.Replayed)
					require.Equal(t, 1, e.cnt.Starts(ref))
					inv := e.cnt.Invs(ref)[0]
					require.Equal(t, 1, inv.Attempt)
					require.False(t, inv.Redrive, "the tool never started before")
					return res.Output
				}
				var out json.RawMessage
				switch mode {
				case "SameTask", "SameTaskLapsed", "NewTaskValue", "NewTaskValueLapsed":
					if strings.HasSuffix(mode, "Lapsed") {
						e.b.clock.Advance(rt2Lapse)
					}
					retry := task
					if strings.HasPrefix(mode, "NewTaskValue") {
						retry = e.g.Task("acme", "lost")
					}
					out = sameProcess(retry)
				case "OtherBeforeLapse":
					_, err := otherTask.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.ErrorIs(t, err, ledger.ErrInProgress, "the claim is live")
					require.Zero(t, e.cnt.Starts(ref))
					out = sameProcess(task)
				case "OtherAfterLapse":
					e.b.clock.Advance(rt2Lapse)
					res, err := otherTask.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					if !tool.AcceptsKey {
						require.ErrorIs(t, err, agent.ErrUncertain, "another process cannot know the tool never started")
						require.Zero(t, e.cnt.Starts(ref))
						_, err = task.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
						require.ErrorIs(t, err, agent.ErrUncertain, "once reported uncertain, the call stays so")
						require.Zero(t, e.cnt.Starts(ref))
						return
					}
					require.NoError(t, err)
					require.Equal(t, 1, e.cnt.Starts(ref))
					require.True(t, e.cnt.Invs(ref)[0].Redrive)
					out = res.Output
					res, err = task.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.NoError(t, err)
					require.True(t, res.Replayed, "the process that lost the claim's answer replays the other's call")
					require.JSONEq(t, string(out), string(res.Output))
				}
				res, err := otherTask.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.JSONEq(t, string(out), string(res.Output))
				require.Equal(t, 1, e.cnt.Starts(ref))
				rec := e.record(t, ref)
				require.NotNil(t, rec)
				require.Equal(t, ledger.StateCompleted, rec.State)
			})
		}
	}
}

// A claim's commit answer is lost on a claimed task. The owner's retry runs the tool
// once, while its task lease lives or after it lapsed with nobody taking over. When
// another agent took the task over, the first owner's retry is fenced, whether the
// call's own lease is live or not, and its tool does not start.
func TestRedteam2LostClaimOnClaimedTask(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, mode := range []string{"TaskLive", "TaskLapsedNotTaken", "ReclaimedBySameProcess", "TakenOverCallLeaseLive", "TakenOverCallLeaseLapsed"} {
			t.Run(tool.Name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				taskLease := time.Minute
				if mode == "TakenOverCallLeaseLive" {
					taskLease = 10 * time.Second
				}
				e := rt2SetupLease(t, nil, taskLease)
				a, err := e.g.ClaimTask(ctx, "acme", "claimed", nil)
				require.NoError(t, err)
				ref := e.ref(t, "claimed", "1", tool)
				e.loseClaim(t, a, "1", tool, rt2Args)

				switch mode {
				case "TaskLive", "TaskLapsedNotTaken", "ReclaimedBySameProcess":
					if mode != "TaskLive" {
						e.b.clock.Advance(2 * time.Minute)
					}
					retry := a
					if mode == "ReclaimedBySameProcess" {
						retry, err = e.g.ClaimTask(ctx, "acme", "claimed", nil)
						require.NoError(t, err)
						require.True(t, retry.TakenOver)
					}
					res, err := retry.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.NoError(t, err, "the tool never started, and this process knows it")
					require.False(t, res.Replayed)
					require.Equal(t, 1, e.cnt.Starts(ref))
					require.False(t, e.cnt.Invs(ref)[0].Redrive)
					require.NoError(t, retry.Finish(ctx, nil))
				case "TakenOverCallLeaseLive", "TakenOverCallLeaseLapsed":
					if mode == "TakenOverCallLeaseLive" {
						e.b.clock.Advance(20 * time.Second) // past the task's lease, within the call's
					} else {
						e.b.clock.Advance(2 * time.Minute)
					}
					b, err := e.other.ClaimTask(ctx, "acme", "claimed", nil)
					require.NoError(t, err)
					require.True(t, b.TakenOver)
					resB, errB := b.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					startsB := e.cnt.Starts(ref)
					switch {
					case mode == "TakenOverCallLeaseLive":
						require.ErrorIs(t, errB, ledger.ErrInProgress, "the first owner's call claim is live")
						require.Zero(t, startsB)
					case tool.AcceptsKey:
						require.NoError(t, errB)
						require.Equal(t, 1, startsB)
					default:
						require.ErrorIs(t, errB, agent.ErrUncertain)
						require.Zero(t, startsB)
					}
					// The first owner comes back and retries the call whose claim it lost.
					_, err = a.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.ErrorIs(t, err, agent.ErrStaleOwner, "a retry by an owner whose task was taken over")
					require.Equal(t, startsB, e.cnt.Starts(ref), "the stale owner's retry started the tool")
					_, err = a.Call(ctx, "2", tool, rt2Args, e.cnt.fn, nil)
					require.ErrorIs(t, err, agent.ErrStaleOwner)
					require.Zero(t, e.cnt.Starts(e.ref(t, "claimed", "2", tool)))
					require.ErrorIs(t, a.Heartbeat(ctx), agent.ErrStaleOwner)
					require.ErrorIs(t, a.Finish(ctx, nil), agent.ErrStaleOwner)
					if errB == nil {
						res, err := b.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
						require.NoError(t, err)
						require.True(t, res.Replayed)
						require.JSONEq(t, string(resB.Output), string(res.Output))
					}
					require.NoError(t, b.Finish(ctx, nil))
				}
			})
		}
	}
}

// The same process resumes a claim whose answer was lost after its lease lapsed: the
// tool then owns the call's key for a fresh lease while it runs, so another process's
// retry waits rather than taking the key over (and, for a tool without a key, reporting
// it uncertain, or for one with a key, running it a second time at once).
func TestRedteam2ResumedClaimOwnsItsLease(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, nil)
			task := e.g.Task("acme", "resume")
			ref := e.ref(t, "resume", "1", tool)
			e.loseClaim(t, task, "1", tool, rt2Args)
			e.b.clock.Advance(rt2Lapse)

			var inside atomic.Bool
			var otherErr error
			var rec *ledger.Record
			e.cnt.setDuring(func(inv agent.Invocation) {
				if !inside.CompareAndSwap(false, true) {
					return
				}
				rec = e.record(t, ref)
				_, otherErr = e.other.Task("acme", "resume").Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
			})
			res, err := task.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
			e.cnt.setDuring(nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.NotNil(t, rec)
			require.Equal(t, ledger.StatePending, rec.State)
			require.False(t, rec.LeaseExpired, "the resumed claim runs its tool on a lease that ran out (until %v)", rec.LeaseUntil)
			require.ErrorIs(t, otherErr, ledger.ErrInProgress, "another process's retry while the resumed call runs")
			require.Equal(t, 1, e.cnt.Starts(ref))
		})
	}
}

// rt2Case is one interleaving of a call whose connection is cut after one of its round
// trips, and of its retry.
type rt2Case struct {
	tool    agent.Tool
	claimed bool
	// n is the round trip (counting those that execute) after which the connection is cut.
	n int
	// retry is who retries: "same" (the same *Task), "fresh" (another *Task value of the
	// same process) or "other" (another process).
	retry string
	// lapse moves the clock past the call's lease before the retry.
	lapse bool
}

func (c rt2Case) String() string {
	return fmt.Sprintf("%s claimed=%v cut after round trip %d, retry by %s, lapse=%v", c.tool.Name, c.claimed, c.n, c.retry, c.lapse)
}

// probe runs one rt2Case on task id and reports every answer that was not true. It
// returns whether the proxy cut a round trip.
func (e rt2Env) probe(t *testing.T, c rt2Case, id string) bool {
	t.Helper()
	ctx := context.Background()
	var task *agent.Task
	if c.claimed {
		var err error
		task, err = e.g.ClaimTask(ctx, "acme", id, nil)
		require.NoError(t, err)
	} else {
		task = e.g.Task("acme", id)
	}
	ref := e.ref(t, id, "1", c.tool)

	e.px.Arm(faultproxy.CutAfter, c.n, true)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	res1, err1 := task.Call(cctx, "1", c.tool, rt2Args, e.cnt.fn, nil)
	cancel()
	fired, at := e.px.Disarm()
	if fired {
		e.px.Settle(t, e.b.pool)
	}
	s1 := e.cnt.Starts(ref)
	rec1 := e.record(t, ref)
	label := fmt.Sprintf("%v (%.90q)", c, at)
	state := func(r *ledger.Record) string {
		if r == nil {
			return "no record"
		}
		return fmt.Sprintf("%s uncertain=%v lease expired=%v attempts=%d", r.State, r.Uncertain, r.LeaseExpired, r.Attempts)
	}
	t.Logf("%s: heard %v; tool started %d; record: %s", label, err1, s1, state(rec1))
	if !fired && err1 != nil {
		// No armed cut: an earlier cut can leave a dead connection in the pool.
		t.Logf("%s: no armed cut, and the call heard %v", label, err1)
	}

	// What the first caller heard.
	switch {
	case err1 == nil:
		if s1 != 1 || rec1 == nil || rec1.State != ledger.StateCompleted {
			t.Errorf("%s: heard success, yet the tool started %d times and the record is %s", label, s1, state(rec1))
		}
	case errors.Is(err1, agent.ErrUncertain):
		if s1 == 0 {
			t.Errorf("%s: heard uncertain (%v), yet the tool never started", label, err1)
		}
	case errors.Is(err1, ledger.ErrOutcomeUnknown):
		if s1 != 0 && !c.tool.AcceptsKey {
			t.Logf("%s: NOTE heard an outcome-unknown error (%v) after the tool started; the contract gives it for a claim whose tool has not started", label, err1)
		}
	default:
		if s1 == 0 && rec1 != nil && rec1.State == ledger.StatePending {
			t.Errorf("%s: heard %v, neither uncertain nor outcome unknown, so nothing is recorded; yet the claim is pending (%s)", label, err1, state(rec1))
		}
	}

	// The retry.
	var retry *agent.Task
	switch c.retry {
	case "same":
		retry = task
	case "fresh":
		retry = e.g.Task("acme", id)
	case "other":
		retry = e.other.Task("acme", id)
	}
	if c.lapse {
		e.b.clock.Advance(rt2Lapse)
	}
	res2, err2 := retry.Call(ctx, "1", c.tool, rt2Args, e.cnt.fn, nil)
	if errors.Is(err2, ledger.ErrInProgress) && !c.lapse {
		t.Logf("%s: retry heard %v before the lease lapsed; retrying after", label, err2)
		e.b.clock.Advance(rt2Lapse)
		res2, err2 = retry.Call(ctx, "1", c.tool, rt2Args, e.cnt.fn, nil)
	}
	s2 := e.cnt.Starts(ref)
	rec2 := e.record(t, ref)
	t.Logf("%s: retry heard %v (replayed=%v); tool started %d; record: %s", label, err2, res2.Replayed, s2, state(rec2))
	sameProcess := c.retry != "other"
	switch {
	case err1 == nil || (s1 == 1 && rec1 != nil && rec1.State == ledger.StateCompleted):
		if err2 != nil || !res2.Replayed || s2 != s1 {
			t.Errorf("%s: the call completed, and its retry heard %v (replayed=%v, starts %d→%d)", label, err2, res2.Replayed, s1, s2)
		} else if err1 == nil && !rt2JSONEq(res1.Output, res2.Output) {
			t.Errorf("%s: heard %s, then the retry replayed %s", label, res1.Output, res2.Output)
		} else if sum := e.cnt.Invs(ref); len(sum) == 1 && !rt2JSONEq(res2.Output, rt2OutputOf(sum[0], 1)) {
			t.Errorf("%s: the retry replayed %s, the tool's one run answered %s", label, res2.Output, rt2OutputOf(sum[0], 1))
		}
	case s1 == 0 && sameProcess:
		if err2 != nil || s2 != 1 {
			t.Errorf("%s: the tool never started, and the same process's retry heard %v with %d starts", label, err2, s2)
		}
	case s1 == 0:
		if err2 == nil && s2 != 1 {
			t.Errorf("%s: the retry succeeded with %d starts", label, s2)
		}
		if errors.Is(err2, agent.ErrUncertain) && (c.tool.AcceptsKey || rec1 == nil) {
			t.Errorf("%s: the retry heard uncertain (%v), though the tool takes a key or nothing was claimed", label, err2)
		}
	case !c.tool.AcceptsKey:
		if !errors.Is(err2, agent.ErrUncertain) {
			t.Errorf("%s: the tool acted and nothing was stored; the retry heard %v (starts %d)", label, err2, s2)
		}
	default:
		if err2 != nil {
			t.Errorf("%s: a keyed call whose record was lost, retried: %v", label, err2)
		} else if invs := e.cnt.Invs(ref); s2 != 2 || !invs[1].Redrive || invs[1].DownstreamKey != invs[0].DownstreamKey {
			t.Errorf("%s: a keyed call redriven with %d starts, invocations %+v", label, s2, invs)
		}
	}
	if !c.tool.AcceptsKey && s2 > 1 {
		t.Errorf("%s: a tool without a key started %d times", label, s2)
	}

	// Every later call, by another process too, hears what the record says.
	e.b.clock.Advance(rt2Lapse)
	later := e.other.Task("acme", id)
	if c.claimed {
		later = task // a claimed task is called by its owner
	}
	res3, err3 := later.Call(ctx, "1", c.tool, rt2Args, e.cnt.fn, nil)
	switch {
	case err2 == nil:
		if err3 != nil || !res3.Replayed || !rt2JSONEq(res3.Output, res2.Output) {
			t.Errorf("%s: the retry heard %s; a later call heard %v (replayed=%v, %s)", label, res2.Output, err3, res3.Replayed, res3.Output)
		}
	case errors.Is(err2, agent.ErrUncertain):
		if !errors.Is(err3, agent.ErrUncertain) {
			t.Errorf("%s: the retry heard uncertain; a later call heard %v", label, err3)
		}
	}
	if !c.tool.AcceptsKey && e.cnt.Starts(ref) > 1 {
		t.Errorf("%s: a tool without a key started %d times", label, e.cnt.Starts(ref))
	}
	if c.claimed {
		if err := task.Finish(ctx, nil); err != nil && !errors.Is(err, agent.ErrStaleOwner) {
			t.Errorf("%s: Finish: %v", label, err)
		}
	}
	return fired
}

// Every round trip of a call is cut in turn, for each kind of tool, claimed and
// unclaimed tasks, retries by the same process and by another, before and after the
// call's lease lapses.
func TestRedteam2CutEveryRoundTrip(t *testing.T) {
	t.Parallel()
	type combo struct {
		tool    agent.Tool
		claimed bool
		retry   string
		lapse   bool
	}
	var combos []combo
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, lapse := range []bool{false, true} {
			for _, retry := range []string{"same", "fresh", "other"} {
				combos = append(combos, combo{tool, false, retry, lapse})
			}
			combos = append(combos, combo{tool, true, "same", lapse})
		}
	}
	for _, cb := range combos {
		t.Run(fmt.Sprintf("%s/claimed=%v/%s/lapse=%v", cb.tool.Name, cb.claimed, cb.retry, cb.lapse), func(t *testing.T) {
			t.Parallel()
			e := rt2Setup(t, nil)
			for n := 1; ; n++ {
				require.Less(t, n, 40, "the call makes fewer round trips than this")
				if !e.probe(t, rt2Case{tool: cb.tool, claimed: cb.claimed, n: n, retry: cb.retry, lapse: cb.lapse}, "cut-"+strconv.Itoa(n)) {
					break
				}
			}
		})
	}
}

// rt2Seed is ONCEKIT_SEED when set, else a fresh seed; the test prints it.
func rt2Seed(t *testing.T) int64 {
	seed := time.Now().UnixNano()
	if s := os.Getenv("ONCEKIT_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err)
		seed = v
	}
	t.Logf("seed %d (ONCEKIT_SEED=%d replays it)", seed, seed)
	return seed
}

// Random interleavings of rt2Case, with a printed seed.
func TestRedteam2RandomLostAnswers(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(rt2Seed(t)))
	e := rt2Setup(t, nil)
	for i := 0; i < 60; i++ {
		c := rt2Case{
			tool:    []agent.Tool{smtpSend, emailAPI}[rng.Intn(2)],
			claimed: rng.Intn(3) == 0,
			n:       1 + rng.Intn(6),
			retry:   []string{"same", "fresh", "other"}[rng.Intn(3)],
			lapse:   rng.Intn(2) == 0,
		}
		if c.claimed {
			c.retry = "same"
		}
		e.probe(t, c, "random-"+strconv.Itoa(i))
	}
}

// After a claim's answer is lost, 24 goroutines of the same process retry the call at
// once, through the same task and through other values of it, with and without a
// wait, before and after the call's lease lapsed. The tool starts once, nobody hears
// it uncertain, and everyone who hears an output hears the same.
func TestRedteam2ConcurrentRetriesAfterLostClaim(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			for _, lapse := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/wait=%v/lapse=%v", tool.Name, wait, lapse), func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					e := rt2Setup(t, nil)
					task := e.g.Task("acme", "herd")
					ref := e.ref(t, "herd", "1", tool)
					e.loseClaim(t, task, "1", tool, rt2Args)
					if lapse {
						e.b.clock.Advance(rt2Lapse)
					}
					const n = 24
					results := make([]agent.Result, n)
					errs := make([]error, n)
					start := make(chan struct{})
					var wg sync.WaitGroup
					for i := 0; i < n; i++ {
						wg.Add(1)
						go func(i int) {
							defer wg.Done()
							tk := task
							if i%2 == 1 {
								tk = e.g.Task("acme", "herd")
							}
							<-start
							results[i], errs[i] = tk.Call(ctx, "1", tool, rt2Args, e.cnt.fn, &agent.CallOpts{Wait: wait})
						}(i)
					}
					close(start)
					wg.Wait()
					var outs []string
					first := 0
					for i, err := range errs {
						switch {
						case err == nil:
							outs = append(outs, string(results[i].Output))
							if !results[i].Replayed {
								first++
							}
						case errors.Is(err, ledger.ErrInProgress) && wait == 0:
						default:
							t.Errorf("goroutine %d heard %v", i, err)
						}
					}
					require.Equal(t, 1, e.cnt.Starts(ref), "the tool's starts")
					require.Equal(t, 1, first, "callers that heard a first run")
					for _, o := range outs {
						require.JSONEq(t, outs[0], o)
					}
					res, err := e.other.Task("acme", "herd").Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
					require.NoError(t, err)
					require.True(t, res.Replayed)
					require.JSONEq(t, outs[0], string(res.Output))
				})
			}
		}
	}
}

// After a claim's answer is lost and its lease lapsed, 12 goroutines of the process
// that lost it and 12 of another process retry at once. Whoever wins, a tool without a
// key starts at most once, a call heard as done was done, and every output heard is
// the same.
func TestRedteam2ConcurrentRetriesTwoProcesses(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, nil)
			task := e.g.Task("acme", "two")
			ref := e.ref(t, "two", "1", tool)
			e.loseClaim(t, task, "1", tool, rt2Args)
			e.b.clock.Advance(rt2Lapse)
			const n = 24
			results := make([]agent.Result, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					tk := task
					if i%2 == 1 {
						tk = e.other.Task("acme", "two")
					}
					<-start
					results[i], errs[i] = tk.Call(ctx, "1", tool, rt2Args, e.cnt.fn, &agent.CallOpts{Wait: 10 * time.Second})
				}(i)
			}
			close(start)
			wg.Wait()
			starts := e.cnt.Starts(ref)
			var outs []string
			for i, err := range errs {
				t.Logf("goroutine %d (%s): %v", i, map[bool]string{true: "other process", false: "same process"}[i%2 == 1], err)
				switch {
				case err == nil:
					outs = append(outs, string(results[i].Output))
				case errors.Is(err, agent.ErrUncertain) && !tool.AcceptsKey:
				case errors.Is(err, ledger.ErrInProgress):
				default:
					t.Errorf("goroutine %d heard %v", i, err)
				}
			}
			if !tool.AcceptsKey {
				require.LessOrEqual(t, starts, 1)
			}
			if len(outs) > 0 {
				require.GreaterOrEqual(t, starts, 1, "a call heard as done never ran")
			}
			for _, o := range outs {
				require.JSONEq(t, outs[0], o)
			}
		})
	}
}

// The answer of the round trip that follows the tool (the one that records its output)
// is lost, then 24 goroutines of both processes retry once the call's lease lapsed. A
// tool without a key is never repeated; one with a key is made again at most once, with
// the same key; every output heard is the one stored.
func TestRedteam2ConcurrentRetriesAfterLostRecord(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, nil)
			task := e.g.Task("acme", "record")
			ref := e.ref(t, "record", "1", tool)
			e.cnt.setDuring(func(agent.Invocation) { e.px.Arm(faultproxy.CutAfter, 1, true) })
			_, err1 := task.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
			e.cnt.setDuring(nil)
			fired, at := e.px.Disarm()
			require.True(t, fired)
			e.px.Settle(t, e.b.pool)
			rec := e.record(t, ref)
			require.NotNil(t, rec)
			t.Logf("cut after %.90q: heard %v; record %s uncertain=%v", at, err1, rec.State, rec.Uncertain)
			require.Equal(t, 1, e.cnt.Starts(ref))
			if err1 == nil {
				require.Equal(t, ledger.StateCompleted, rec.State, "heard success")
			}
			e.b.clock.Advance(rt2Lapse)

			const n = 24
			results := make([]agent.Result, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					tk := task
					switch i % 3 {
					case 1:
						tk = e.g.Task("acme", "record")
					case 2:
						tk = e.other.Task("acme", "record")
					}
					<-start
					results[i], errs[i] = tk.Call(ctx, "1", tool, rt2Args, e.cnt.fn, &agent.CallOpts{Wait: 10 * time.Second})
				}(i)
			}
			close(start)
			wg.Wait()
			var outs []string
			for i, err := range errs {
				switch {
				case err == nil:
					outs = append(outs, string(results[i].Output))
				case errors.Is(err, agent.ErrUncertain) && !tool.AcceptsKey && rec.State != ledger.StateCompleted:
				default:
					t.Errorf("goroutine %d heard %v (record %s)", i, err, rec.State)
				}
			}
			if tool.AcceptsKey {
				require.LessOrEqual(t, e.cnt.Starts(ref), 2)
				invs := e.cnt.Invs(ref)
				for _, inv := range invs[1:] {
					require.True(t, inv.Redrive)
					require.Equal(t, invs[0].DownstreamKey, inv.DownstreamKey)
				}
			} else {
				require.Equal(t, 1, e.cnt.Starts(ref), "a tool without a key")
			}
			for _, o := range outs {
				require.JSONEq(t, outs[0], o)
			}
			if len(outs) > 0 {
				res, err := e.other.Task("acme", "record").Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.JSONEq(t, outs[0], string(res.Output))
			}
		})
	}
}

// A task's lease lapses while its owner's tool runs; another agent takes the task over
// and makes the same call; then the first owner's tool returns. What the first owner
// hears agrees with the record, and every later call, heartbeat and finish of it is
// refused without starting a tool.
func TestRedteam2TakeOverWhileToolRuns(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, callLapses := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/callLeaseLapses=%v", tool.Name, callLapses), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt2SetupLease(t, nil, 10*time.Second)
				a, err := e.g.ClaimTask(ctx, "acme", "inflight", nil)
				require.NoError(t, err)
				ref := e.ref(t, "inflight", "1", tool)
				var b *agent.Task
				var resB agent.Result
				var errB error
				var inside atomic.Bool
				e.cnt.setDuring(func(agent.Invocation) {
					if !inside.CompareAndSwap(false, true) {
						return
					}
					if callLapses {
						e.b.clock.Advance(rt2Lapse)
					} else {
						e.b.clock.Advance(20 * time.Second)
					}
					var err error
					b, err = e.other.ClaimTask(ctx, "acme", "inflight", nil)
					if err != nil {
						t.Errorf("take-over: %v", err)
						return
					}
					resB, errB = b.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				})
				resA, errA := a.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				e.cnt.setDuring(nil)
				require.NotNil(t, b)
				require.True(t, b.TakenOver)
				rec := e.record(t, ref)
				t.Logf("new owner heard %v; first owner heard %v (%s); starts %d; record %s uncertain=%v", errB, errA, resA.Output, e.cnt.Starts(ref), rec.State, rec.Uncertain)
				switch {
				case !callLapses:
					require.ErrorIs(t, errB, ledger.ErrInProgress, "the call's own lease is live")
				case tool.AcceptsKey:
					require.NoError(t, errB)
				default:
					require.ErrorIs(t, errB, agent.ErrUncertain)
				}
				if !tool.AcceptsKey {
					require.Equal(t, 1, e.cnt.Starts(ref))
				}
				if errA == nil {
					require.Equal(t, ledger.StateCompleted, rec.State, "the first owner heard success")
				} else if !errors.Is(errA, agent.ErrStaleOwner) && !errors.Is(errA, agent.ErrUncertain) {
					// Its tool acted and another attempt took the call over: the contract's answers are
					// a stale owner's refusal or a call that may have happened.
					t.Errorf("the first owner's tool acted and another attempt took its call over; it heard %v, neither agent.ErrStaleOwner nor agent.ErrUncertain", errA)
				}
				if errB == nil {
					require.Equal(t, ledger.StateCompleted, rec.State)
				}
				startsBefore := e.cnt.Starts(ref)
				_, err = a.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				require.ErrorIs(t, err, agent.ErrStaleOwner)
				_, err = a.Call(ctx, "2", tool, rt2Args, e.cnt.fn, nil)
				require.ErrorIs(t, err, agent.ErrStaleOwner)
				require.Equal(t, startsBefore, e.cnt.Starts(ref))
				require.Zero(t, e.cnt.Starts(e.ref(t, "inflight", "2", tool)))
				require.ErrorIs(t, a.Heartbeat(ctx), agent.ErrStaleOwner)
				require.ErrorIs(t, a.Finish(ctx, nil), agent.ErrStaleOwner)
				// The new owner's retry hears what the record says.
				res, err := b.Call(ctx, "1", tool, rt2Args, e.cnt.fn, nil)
				if rec.State == ledger.StateCompleted {
					require.NoError(t, err)
					require.True(t, res.Replayed)
					if errA == nil {
						require.JSONEq(t, string(resA.Output), string(res.Output), "the first owner heard an output that is not the stored one")
					}
					if errB == nil {
						require.JSONEq(t, string(resB.Output), string(res.Output))
					}
				} else if !tool.AcceptsKey {
					require.ErrorIs(t, err, agent.ErrUncertain)
				}
				if !tool.AcceptsKey {
					require.Equal(t, 1, e.cnt.Starts(ref))
				}
				require.NoError(t, b.Finish(ctx, json.RawMessage(`{"by":"b"}`)))
				require.ErrorIs(t, a.Finish(ctx, json.RawMessage(`{"by":"b"}`)), agent.ErrStaleOwner, "a stale owner finishing with the new owner's outcome")
			})
		}
	}
}

// Each round trip of Finish is cut in turn; the owner retries, with the same and with
// another outcome, before or after its task lease lapsed, or another agent claims the
// task first. What each hears agrees with whether the first Finish committed.
func TestRedteam2FinishCutEveryRoundTrip(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"Retry", "RetryAfterLapse", "OtherClaimsFirst"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, nil)
			for n := 1; ; n++ {
				require.Less(t, n, 40)
				id := "finish-" + strconv.Itoa(n)
				a, err := e.g.ClaimTask(ctx, "acme", id, &agent.ClaimTaskOpts{Lease: time.Minute})
				require.NoError(t, err)
				e.px.Arm(faultproxy.CutAfter, n, true)
				errF := a.Finish(ctx, json.RawMessage(`{"outcome":"x"}`))
				fired, at := e.px.Disarm()
				if !fired {
					require.NoError(t, errF)
					break
				}
				e.px.Settle(t, e.b.pool)
				label := fmt.Sprintf("%s: Finish cut after round trip %d (%.90q), heard %v", mode, n, at, errF)
				t.Log(label)
				if mode != "Retry" {
					e.b.clock.Advance(2 * time.Minute)
				}
				if mode == "OtherClaimsFirst" {
					b, errB := e.other.ClaimTask(ctx, "acme", id, nil)
					switch {
					case errors.Is(errB, agent.ErrTaskDone):
						if err := a.Finish(ctx, json.RawMessage(`{"outcome":"x"}`)); err != nil {
							t.Errorf("%s: the first Finish committed; the owner's retry heard %v", label, err)
						}
					case errB == nil:
						if errF == nil {
							t.Errorf("%s: heard success, yet another agent took the unfinished task over", label)
						}
						if err := a.Finish(ctx, json.RawMessage(`{"outcome":"x"}`)); !errors.Is(err, agent.ErrStaleOwner) {
							t.Errorf("%s: the stale owner's retry heard %v", label, err)
						}
						require.NoError(t, b.Finish(ctx, json.RawMessage(`{"outcome":"y"}`)))
					default:
						t.Errorf("%s: another agent's claim heard %v", label, errB)
					}
					continue
				}
				if err := a.Finish(ctx, json.RawMessage(`{"outcome":"x"}`)); err != nil {
					t.Errorf("%s: the owner's retry with the same outcome heard %v", label, err)
				}
				if err := a.Finish(ctx, json.RawMessage(`{"outcome":"y"}`)); !errors.Is(err, agent.ErrTaskDone) || errors.Is(err, agent.ErrStaleOwner) {
					t.Errorf("%s: the owner's retry with another outcome heard %v", label, err)
				}
				if _, err := e.other.ClaimTask(ctx, "acme", id, nil); !errors.Is(err, agent.ErrTaskDone) {
					t.Errorf("%s: another agent's claim of the finished task heard %v", label, err)
				}
				_, err = a.Call(ctx, "1", smtpSend, rt2Args, e.cnt.fn, nil)
				if err == nil || e.cnt.Starts(e.ref(t, id, "1", smtpSend)) != 0 {
					t.Errorf("%s: a call on the finished task heard %v and started the tool %d times", label, err, e.cnt.Starts(e.ref(t, id, "1", smtpSend)))
				}
			}
		})
	}
}

// A tool acts and returns an output over the ledger's body limit. A tool without a key
// is reported uncertain with the reason, by every retry of any process before and after
// the lease, and never starts again until it is resolved; one with a key is made again
// at once with the same key by another process. The same on a claim resumed after its
// answer was lost. A database tool's writes roll back with the record that cannot be
// stored.
func TestRedteam2OutputOverLimit(t *testing.T) {
	t.Parallel()
	lcfg := &ledger.Config{MaxBodyBytes: 512}
	for _, resumed := range []bool{false, true} {
		t.Run(fmt.Sprintf("Plain/resumed=%v", resumed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, lcfg)
			e.cnt.big = 4096
			task := e.g.Task("acme", "big")
			ref := e.ref(t, "big", "1", smtpSend)
			if resumed {
				e.loseClaim(t, task, "1", smtpSend, rt2Args)
			}
			_, err := task.Call(ctx, "1", smtpSend, rt2Args, e.cnt.fn, nil)
			var unc *agent.UncertainError
			require.ErrorAs(t, err, &unc)
			require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
			require.Equal(t, 1, e.cnt.Starts(ref))
			rec := e.record(t, ref)
			require.NotNil(t, rec)
			require.NotEqual(t, ledger.StateCompleted, rec.State)
			for i, retry := range []*agent.Task{task, e.g.Task("acme", "big"), e.other.Task("acme", "big")} {
				for _, lapse := range []time.Duration{0, rt2Lapse} {
					e.b.clock.Advance(lapse)
					_, err := retry.Call(ctx, "1", smtpSend, rt2Args, e.cnt.fn, nil)
					require.ErrorIs(t, err, agent.ErrUncertain, "retry %d after %v", i, lapse)
				}
			}
			require.Equal(t, 1, e.cnt.Starts(ref))
			require.NoError(t, e.other.Resolve(ctx, unc.Call, true, json.RawMessage(`{"ref":"elsewhere"}`)))
			res, err := task.Call(ctx, "1", smtpSend, rt2Args, e.cnt.fn, nil)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			require.JSONEq(t, `{"ref":"elsewhere"}`, string(res.Output))
			require.Equal(t, 1, e.cnt.Starts(ref))
		})
		t.Run(fmt.Sprintf("Keyed/resumed=%v", resumed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, lcfg)
			e.cnt.big = 4096
			task := e.g.Task("acme", "big")
			ref := e.ref(t, "big", "1", emailAPI)
			if resumed {
				e.loseClaim(t, task, "1", emailAPI, rt2Args)
			}
			_, err := task.Call(ctx, "1", emailAPI, rt2Args, e.cnt.fn, nil)
			require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
			require.NotErrorIs(t, err, agent.ErrUncertain)
			require.Equal(t, 1, e.cnt.Starts(ref))
			// Another process, at once: the call is recorded as one that may have
			// happened, which hands its key over.
			res, err := e.other.Task("acme", "big").Call(ctx, "1", emailAPI, rt2Args, e.cnt.fn, nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			invs := e.cnt.Invs(ref)
			require.Len(t, invs, 2)
			require.True(t, invs[1].Redrive)
			require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
			again, err := task.Call(ctx, "1", emailAPI, rt2Args, e.cnt.fn, nil)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.JSONEq(t, string(res.Output), string(again.Output))
		})
	}
	t.Run("Local", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e := rt2Setup(t, lcfg)
		task := e.g.Task("acme", "big")
		ref := e.ref(t, "big", "1", ticket)
		var runs atomic.Int32
		local := func(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
			n := runs.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO effects (call, body) VALUES ($1, 'x')`, string(inv.Call.Key)); err != nil {
				return nil, err
			}
			if n == 1 {
				return json.RawMessage(`{"pad":"` + strings.Repeat("a", 4096) + `"}`), nil
			}
			return json.RawMessage(`{"run":` + strconv.Itoa(int(n)) + `}`), nil
		}
		res, err := task.CallTx(ctx, "1", ticket, rt2Args, local, nil)
		n := effects(t, e.b.pool, ref)
		t.Logf("heard %v (%d bytes); effects %d", err, len(res.Output), n)
		if err == nil {
			require.Equal(t, 1, n)
			again, err := task.CallTx(ctx, "1", ticket, rt2Args, local, nil)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.JSONEq(t, string(res.Output), string(again.Output))
			return
		}
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
		require.Zero(t, n, "the call failed, yet its writes committed")
		res, err = task.CallTx(ctx, "1", ticket, rt2Args, local, nil)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, 1, effects(t, e.b.pool, ref))
	})
}

// Calls under a context whose deadline is shorter than the claim's round trip, random
// over 0–4 ms, 100 of them, each retried by the same process or, after the lease, by
// another. What each caller heard is checked against the tool's starts and the record.
func TestRedteam2RandomDeadlines(t *testing.T) {
	t.Parallel()
	seed := rt2Seed(t)
	for _, claimed := range []bool{false, true} {
		t.Run(fmt.Sprintf("claimed=%v", claimed), func(t *testing.T) {
			t.Parallel()
			rt2RandomDeadlines(t, rand.New(rand.NewSource(seed)), claimed)
		})
	}
}

func rt2RandomDeadlines(t *testing.T, rng *rand.Rand, claimed bool) {
	e := rt2Setup(t, nil)
	g := e.other // straight to PostgreSQL: the deadline is the only fault
	ctx := context.Background()
	task := g.Task("acme", "deadlines")
	if claimed {
		var err error
		task, err = g.ClaimTask(ctx, "acme", "deadlines", &agent.ClaimTaskOpts{Lease: 1000 * time.Hour})
		require.NoError(t, err)
	}
	heard := map[string]int{}
	for i := 0; i < 100; i++ {
		tool := []agent.Tool{smtpSend, emailAPI}[rng.Intn(2)]
		d := time.Duration(rng.Int63n(int64(4*time.Millisecond) + 1))
		step := strconv.Itoa(i)
		ref, err := g.Ref("acme", "deadlines", step, tool.Name)
		require.NoError(t, err)
		cctx, cancel := context.WithTimeout(ctx, d)
		res1, err1 := task.Call(cctx, step, tool, rt2Args, e.cnt.fn, nil)
		cancel()
		s1 := e.cnt.Starts(ref)
		rec1 := e.record(t, ref)
		label := fmt.Sprintf("call %d (%s, deadline %v)", i, tool.Name, d)
		switch {
		case err1 == nil:
			heard["success"]++
			if s1 != 1 || rec1 == nil || rec1.State != ledger.StateCompleted {
				t.Errorf("%s: heard success, yet the tool started %d times and the record is %+v", label, s1, rec1)
			}
		case errors.Is(err1, agent.ErrUncertain):
			heard["uncertain"]++
			if s1 == 0 {
				t.Errorf("%s: heard uncertain (%v), yet the tool never started", label, err1)
			}
		case errors.Is(err1, ledger.ErrOutcomeUnknown):
			heard["outcome unknown"]++
			if s1 != 0 && !tool.AcceptsKey {
				t.Logf("%s: NOTE heard an outcome-unknown error (%v) after the tool started", label, err1)
			}
		default:
			heard["other error"]++
			if s1 == 0 && rec1 != nil && rec1.State == ledger.StatePending {
				t.Errorf("%s: heard %v, which says nothing is recorded; yet the claim is pending", label, err1)
			}
		}
		other := rng.Intn(4) == 0 && !claimed // a claimed task is called by its owner
		retry := task
		if other {
			e.b.clock.Advance(rt2Lapse)
			retry = e.g.Task("acme", "deadlines")
		} else if rng.Intn(2) == 0 {
			e.b.clock.Advance(rt2Lapse)
		}
		res2, err2 := retry.Call(ctx, step, tool, rt2Args, e.cnt.fn, nil)
		s2 := e.cnt.Starts(ref)
		switch {
		case s1 == 0 && !other && errors.Is(err2, ledger.ErrInProgress) && s2 == 0:
			// The first call's claim may still be committing on the server, which the
			// context's end did not stop: "in progress, retry later" is true then.
		case s1 == 0 && !other:
			if err2 != nil || s2 != 1 {
				t.Errorf("%s: heard %v with the tool never started; the same process's retry heard %v with %d starts", label, err1, err2, s2)
			}
		case s1 == 0:
			if errors.Is(err2, agent.ErrUncertain) && (tool.AcceptsKey || rec1 == nil) {
				t.Errorf("%s: another process's retry heard %v", label, err2)
			}
		case rec1 != nil && rec1.State == ledger.StateCompleted:
			if err2 != nil || !res2.Replayed {
				t.Errorf("%s: the call completed; its retry heard %v (replayed=%v)", label, err2, res2.Replayed)
			}
		case !tool.AcceptsKey:
			if !errors.Is(err2, agent.ErrUncertain) && !(err2 == nil && res2.Replayed) {
				t.Errorf("%s: the tool acted; the retry heard %v", label, err2)
			}
		default:
			if err2 != nil {
				t.Errorf("%s: a keyed call's retry heard %v", label, err2)
			}
		}
		if !tool.AcceptsKey && s2 > 1 {
			t.Errorf("%s: a tool without a key started %d times", label, s2)
		}
		if err1 == nil && (err2 != nil || !rt2JSONEq(res2.Output, res1.Output)) {
			t.Errorf("%s: heard %s first and %v, %s on the retry", label, res1.Output, err2, res2.Output)
		}
	}
	t.Logf("first answers: %v", heard)
}

// A claim's own lease (ClaimTaskOpts.Lease) overrides the guard's task lease "for this
// claim", and every tool call renews the claim: the renewal keeps the claim's lease, so
// an agent that asked for a short lease and died after a call is taken over once that
// lease lapsed, not after the guard's longer one.
func TestRedteam2ClaimLeaseOverrideKeptByCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt2SetupLease(t, nil, time.Hour)
	a, err := e.other.ClaimTask(ctx, "acme", "short", &agent.ClaimTaskOpts{Lease: 10 * time.Second})
	require.NoError(t, err)
	before := a.LeaseUntil()
	_, err = a.Call(ctx, "1", smtpSend, rt2Args, e.cnt.fn, nil)
	require.NoError(t, err)
	e.b.clock.Advance(20 * time.Second)
	b, err := e.g.ClaimTask(ctx, "acme", "short", nil)
	require.NoError(t, err, "the claim asked for a 10s lease (until %v); after a tool call it is held until %v", before, a.LeaseUntil())
	require.True(t, b.TakenOver)
}

// A call's agent dies after its tool acted (its context ends before the output is
// recorded); once the call's lease lapsed, 24 goroutines of two processes retry it at
// once. No lost answer is involved: each hears the stored output, a wait, or, for a
// tool without a key, that the call is uncertain; none hears a database error.
func TestRedteam2ConcurrentTakeOverAfterCrash(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt2Setup(t, nil)
			ref := e.ref(t, "crash", "1", tool)
			dctx, die := context.WithCancel(ctx)
			_, err := e.other.Task("acme", "crash").Call(dctx, "1", tool, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				out, _ := e.cnt.fn(ctx, inv)
				die()
				return out, ctx.Err()
			}, nil)
			require.Error(t, err)
			require.Equal(t, 1, e.cnt.Starts(ref))
			e.b.clock.Advance(rt2Lapse)
			const n = 24
			results := make([]agent.Result, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					g := e.g
					if i%2 == 1 {
						g = e.other
					}
					<-start
					results[i], errs[i] = g.Task("acme", "crash").Call(ctx, "1", tool, rt2Args, e.cnt.fn, &agent.CallOpts{Wait: 10 * time.Second})
				}(i)
			}
			close(start)
			wg.Wait()
			var outs []string
			for i, err := range errs {
				switch {
				case err == nil:
					outs = append(outs, string(results[i].Output))
				case errors.Is(err, agent.ErrUncertain) && !tool.AcceptsKey:
				default:
					t.Errorf("goroutine %d heard %v", i, err)
				}
			}
			if tool.AcceptsKey {
				require.Equal(t, 2, e.cnt.Starts(ref), "one redrive")
			} else {
				require.Equal(t, 1, e.cnt.Starts(ref))
			}
			for _, o := range outs {
				require.JSONEq(t, outs[0], o)
			}
		})
	}
}

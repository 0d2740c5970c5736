// Tests of the guard's tool calls and task claims under concurrency, written against the
// contract of package agent (its documentation and docs/agents.md) alone. Each case
// counts how many times a tool function started and checks what every caller heard
// against it: herds of retries of one call from two processes, a slow tool whose call is
// taken over, a claim's own lease, arguments that change while the first call races, an
// approval decided while other arguments race, and deadlines shorter than a wait.
package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/ledger"
)

// rt3Counter counts the starts of tool functions per call. Its outputs name the call's
// arguments and the start, so a second run, or a run with other arguments, answers
// something else.
type rt3Counter struct {
	mu     sync.Mutex
	starts map[string]int
	invs   map[string][]agent.Invocation
}

func newRT3Counter() *rt3Counter {
	return &rt3Counter{starts: map[string]int{}, invs: map[string][]agent.Invocation{}}
}

// start counts a start of inv's call and returns its number.
func (c *rt3Counter) start(inv agent.Invocation) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts[string(inv.Call.Key)]++
	c.invs[string(inv.Call.Key)] = append(c.invs[string(inv.Call.Key)], inv)
	return c.starts[string(inv.Call.Key)]
}

func rt3Output(inv agent.Invocation, n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"args":%s,"start":%d}`, inv.Args, n))
}

// fn is a tool that starts, acts and answers.
func (c *rt3Counter) fn(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
	return rt3Output(inv, c.start(inv)), nil
}

// local is a database tool that counts its runs as starts.
func (c *rt3Counter) local(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
	return rt3Output(inv, c.start(inv)), nil
}

func (c *rt3Counter) Starts(ref agent.CallRef) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.starts[string(ref.Key)]
}

func (c *rt3Counter) Invs(ref agent.CallRef) []agent.Invocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]agent.Invocation(nil), c.invs[string(ref.Key)]...)
}

// rt3Raw reports whether err carries a raw database error (a deadlock, a serialization
// failure, any SQLSTATE) rather than one of the package's answers.
func rt3Raw(err error) bool {
	if err == nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "SQLSTATE") || strings.Contains(s, "deadlock") || strings.Contains(s, "could not serialize")
}

// rt3Env is rt2Env (two processes on one schema and clock) with a counter of its own.
type rt3Env struct {
	rt2Env
	c *rt3Counter
}

func rt3Setup(t testing.TB, taskLease time.Duration) rt3Env {
	t.Helper()
	return rt3Env{rt2Env: rt2SetupLease(t, nil, taskLease), c: newRT3Counter()}
}

// loseClaim makes the call through the lossy process with its claim's COMMIT answer
// lost, and checks that the caller heard an outcome-unknown error and no tool started.
func (e rt3Env) loseClaim(t testing.TB, task *agent.Task, step string, tool agent.Tool, args json.RawMessage) {
	t.Helper()
	before := e.px.Count(faultproxy.CommitLost)
	e.px.SetEnabled(true)
	_, err := task.Call(context.Background(), step, tool, args, e.c.fn, nil)
	e.px.SetEnabled(false)
	require.Equal(t, before+1, e.px.Count(faultproxy.CommitLost), "the claim's COMMIT went through the proxy")
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown)
	require.NotErrorIs(t, err, agent.ErrUncertain)
	require.Zero(t, e.c.Starts(e.ref(t, task.ID, step, tool)), "the tool started although its claim's answer was lost")
}

// rt3Heard is what one goroutine of a herd heard.
type rt3Heard struct {
	other bool // the goroutine ran in the process that did not lose the claim
	res   agent.Result
	err   error
}

// rt3HerdCase is one timeline of a herd of retries of one call after its claim's answer
// was lost.
type rt3HerdCase struct {
	tool agent.Tool
	// same and other are the goroutines of the process that lost the claim and of
	// another process.
	same, other int
	wait        time.Duration
	// lapse moves the clock past the call's lease before the herd; lapseAfter, when not
	// zero, moves it while the herd runs, that long after it started.
	lapse      bool
	lapseAfter time.Duration
}

func (c rt3HerdCase) String() string {
	return fmt.Sprintf("%s same=%d other=%d wait=%v lapse=%v lapseAfter=%v", c.tool.Name, c.same, c.other, c.wait, c.lapse, c.lapseAfter)
}

// herd runs c on task id and checks what every goroutine heard against the tool's
// starts.
func (e rt3Env) herd(t *testing.T, c rt3HerdCase, id string) {
	t.Helper()
	ctx := context.Background()
	task := e.g.Task("acme", id)
	ref := e.ref(t, id, "1", c.tool)
	e.loseClaim(t, task, "1", c.tool, rt2Args)
	if c.lapse {
		e.b.clock.Advance(rt2Lapse)
	}
	n := c.same + c.other
	heard := make([]rt3Heard, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		other := i >= c.same
		heard[i].other = other
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tk := task
			switch {
			case other:
				tk = e.other.Task("acme", id)
			case i%2 == 1:
				tk = e.g.Task("acme", id)
			}
			<-start
			heard[i].res, heard[i].err = tk.Call(ctx, "1", c.tool, rt2Args, e.c.fn, &agent.CallOpts{Wait: c.wait})
		}(i)
	}
	if c.lapseAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(c.lapseAfter)
			e.b.clock.Advance(rt2Lapse)
		}()
	}
	close(start)
	wg.Wait()

	starts := e.c.Starts(ref)
	var outs []string
	var firstRuns, uncSame, uncOther, leaseLost int
	for i, h := range heard {
		who := map[bool]string{false: "same process", true: "other process"}[h.other]
		switch {
		case rt3Raw(h.err):
			t.Errorf("%v: goroutine %d (%s) heard a raw database error: %v", c, i, who, h.err)
		case h.err == nil:
			outs = append(outs, string(h.res.Output))
			if !h.res.Replayed {
				firstRuns++
			}
		case errors.Is(h.err, agent.ErrUncertain) && errors.Is(h.err, ledger.ErrLeaseLost):
			// The attempt whose tool ran while the clock moved past its lease, and whose
			// call another attempt took over.
			leaseLost++
			if c.lapseAfter == 0 {
				t.Errorf("%v: goroutine %d (%s) heard %v, yet the clock did not move while the herd ran", c, i, who, h.err)
			}
		case errors.Is(h.err, agent.ErrUncertain):
			if h.other {
				uncOther++
			} else {
				uncSame++
			}
		case errors.Is(h.err, ledger.ErrInProgress):
			if c.wait > 0 && c.lapseAfter == 0 {
				t.Errorf("%v: goroutine %d (%s) waited %v and heard %v", c, i, who, c.wait, h.err)
			}
		default:
			t.Errorf("%v: goroutine %d (%s) heard %v", c, i, who, h.err)
		}
	}
	t.Logf("%v: starts %d, outputs %d (first runs %d), uncertain same/other %d/%d, lease lost %d", c, starts, len(outs), firstRuns, uncSame, uncOther, leaseLost)
	// With the clock moved while the herd runs, the tool that resumed the claim may
	// outlive its lease: another attempt then takes the call over (made again with the
	// same key, or reported uncertain), and the slow attempt hears its lease lost.
	overtaken := c.lapseAfter > 0 && starts > 0
	if !c.tool.AcceptsKey && starts > 1 {
		t.Errorf("%v: a tool without a key started %d times", c, starts)
	}
	if len(outs) > 0 && starts == 0 {
		t.Errorf("%v: %d goroutines heard an output, yet the tool never started", c, len(outs))
	}
	if firstRuns > 1 {
		t.Errorf("%v: %d goroutines heard a first run", c, firstRuns)
	}
	for _, o := range outs {
		if !rt2JSONEq([]byte(o), []byte(outs[0])) {
			t.Errorf("%v: outputs heard differ: %s and %s", c, outs[0], o)
			break
		}
	}
	if starts > 0 && !c.tool.AcceptsKey && uncSame+uncOther > 0 && !overtaken {
		// The tool ran once and recorded its output: nobody had reason to call it
		// uncertain, and an uncertain call must never start afterwards.
		t.Errorf("%v: the tool started and %d goroutines heard uncertain", c, uncSame+uncOther)
	}
	if uncSame > 0 && uncOther == 0 {
		t.Errorf("%v: the tool never started before, and %d retries of the process that lost the claim heard it uncertain (no other process did)", c, uncSame)
	}
	if !c.lapse && c.lapseAfter == 0 {
		// The lease is live all along: only the process that lost the claim may resume
		// it, and it knows the tool never started.
		if starts != 1 || uncSame+uncOther > 0 {
			t.Errorf("%v: the lease is live, yet the tool started %d times and %d heard uncertain", c, starts, uncSame+uncOther)
		}
	}
	if c.tool.AcceptsKey && uncSame+uncOther > 0 {
		t.Errorf("%v: a tool with a key was heard uncertain by %d goroutines", c, uncSame+uncOther)
	}
	// Once the clock moved past the lease of the resumed claim, whose tool may be running
	// or about to start, a take-over makes the call again with the same key: the two
	// starts may come in either order, one of them a redrive.
	redriven := func() bool {
		invs := e.c.Invs(ref)
		return len(invs) == 2 && invs[0].Redrive != invs[1].Redrive && invs[0].DownstreamKey == invs[1].DownstreamKey
	}
	if c.tool.AcceptsKey && starts > 1 && !(overtaken && starts == 2 && leaseLost == 1 && redriven()) {
		t.Errorf("%v: a tool with a key whose claim never started ran %d times (lease lost heard %d)", c, starts, leaseLost)
	}
	if leaseLost > 1 {
		t.Errorf("%v: %d attempts heard their lease lost", c, leaseLost)
	}
	for _, inv := range e.c.Invs(ref) {
		if inv.DownstreamKey != e.c.Invs(ref)[0].DownstreamKey {
			t.Errorf("%v: downstream keys differ across starts", c)
		}
	}
	// Every later call, from either process, hears what the record holds.
	e.b.clock.Advance(rt2Lapse)
	for _, tk := range []*agent.Task{task, e.other.Task("acme", id)} {
		res, err := tk.Call(ctx, "1", c.tool, rt2Args, e.c.fn, nil)
		switch {
		case len(outs) > 0:
			if err != nil || !res.Replayed || !rt2JSONEq(res.Output, []byte(outs[0])) {
				t.Errorf("%v: the herd heard %s; a later call heard %v (replayed=%v, %s)", c, outs[0], err, res.Replayed, res.Output)
			}
		case uncSame+uncOther > 0:
			if !errors.Is(err, agent.ErrUncertain) {
				t.Errorf("%v: the herd heard uncertain; a later call heard %v", c, err)
			}
		}
	}
	if !c.tool.AcceptsKey && e.c.Starts(ref) > 1 {
		t.Errorf("%v: a tool without a key started %d times", c, e.c.Starts(ref))
	}
}

// After a claim's answer is lost, 24 goroutines of the process that lost it (through
// its task and through other values of it) and 12 of another process retry the call at
// once, with a wait, before the call's lease lapsed, after it, and while it lapses.
func TestRedteam3HerdAfterLostClaimTwoProcesses(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, tl := range []struct {
			name       string
			lapse      bool
			lapseAfter time.Duration
		}{{"LeaseLive", false, 0}, {"LeaseLapsed", true, 0}, {"LeaseLapsesDuring", false, 5 * time.Millisecond}} {
			c := rt3HerdCase{tool: tool, same: 24, other: 12, wait: 10 * time.Second, lapse: tl.lapse, lapseAfter: tl.lapseAfter}
			t.Run(tool.Name+"/"+tl.name, func(t *testing.T) {
				t.Parallel()
				rt3Setup(t, time.Hour).herd(t, c, "herd")
			})
		}
	}
}

// Random herds after a lost claim, with a printed seed.
func TestRedteam3RandomHerds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(rt2Seed(t)))
	e := rt3Setup(t, time.Hour)
	for i := 0; i < 12; i++ {
		c := rt3HerdCase{
			tool:  []agent.Tool{smtpSend, emailAPI}[rng.Intn(2)],
			same:  1 + rng.Intn(16),
			other: rng.Intn(16),
			wait:  []time.Duration{0, 10 * time.Second}[rng.Intn(2)],
		}
		switch rng.Intn(3) {
		case 0:
			c.lapse = true
		case 1:
			c.lapseAfter = time.Duration(1+rng.Intn(20)) * time.Millisecond
		}
		e.herd(t, c, "random-herd-"+strconv.Itoa(i))
	}
}

// A claimed task whose call's claim answer was lost: its owner retries that call from
// 24 goroutines while the same goroutines make the task's other calls (a tool with a
// key, one without, a database tool) and heartbeat it. Nobody hears a database error
// (the call's claim and the task's renewal lock the same rows in every path), each call
// starts once, and every output heard for a call is the same.
func TestRedteam3ClaimedHerdManySteps(t *testing.T) {
	t.Parallel()
	for _, heartbeats := range []bool{false, true} {
		t.Run(fmt.Sprintf("heartbeats=%v", heartbeats), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			task, err := e.g.ClaimTask(ctx, "acme", "many", nil)
			require.NoError(t, err)
			e.loseClaim(t, task, "1", smtpSend, rt2Args)
			steps := []struct {
				step  string
				tool  agent.Tool
				local bool
			}{{"1", smtpSend, false}, {"2", emailAPI, false}, {"3", smtpSend, false}, {"4", ticket, true}}
			const n = 32
			outs := make([]map[string]string, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			var problems []string
			note := func(format string, args ...any) {
				mu.Lock()
				problems = append(problems, fmt.Sprintf(format, args...))
				mu.Unlock()
			}
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					outs[i] = map[string]string{}
					<-start
					for k := 0; k < len(steps); k++ {
						s := steps[(i+k)%len(steps)]
						// A bound on each call, so that a hang is heard as one.
						cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						if heartbeats && (i+k)%5 == 0 {
							if err := task.Heartbeat(cctx); err != nil {
								note("goroutine %d: heartbeat heard %v", i, err)
							}
						}
						var res agent.Result
						var err error
						if s.local {
							res, err = task.CallTx(cctx, s.step, s.tool, rt2Args, e.c.local, &agent.CallOpts{Wait: 10 * time.Second})
						} else {
							res, err = task.Call(cctx, s.step, s.tool, rt2Args, e.c.fn, &agent.CallOpts{Wait: 10 * time.Second})
						}
						cancel()
						if err != nil {
							note("goroutine %d: step %s heard %v (raw database error: %v)", i, s.step, err, rt3Raw(err))
							continue
						}
						outs[i][s.step] = string(res.Output)
					}
				}(i)
			}
			close(start)
			wg.Wait()
			for i, p := range problems {
				if i < 8 {
					t.Error(p)
				}
			}
			require.Empty(t, problems, "%d calls and heartbeats failed", len(problems))
			for _, s := range steps {
				ref := e.ref(t, "many", s.step, s.tool)
				require.Equal(t, 1, e.c.Starts(ref), "starts of step %s", s.step)
				var first string
				for i := range outs {
					o, ok := outs[i][s.step]
					if !ok {
						continue
					}
					if first == "" {
						first = o
					}
					require.JSONEq(t, first, o, "outputs of step %s", s.step)
				}
			}
			require.NoError(t, task.Finish(ctx, nil))
		})
	}
}

// A call's agent dies after its tool acted. Its own process's goroutines and another
// process's wait for the call while the lease lives; the clock moves past the lease
// while they wait. Nobody hears a database error; a tool without a key is never
// started again and those who do not hear the wait end hear it uncertain; a tool with a
// key is made again once, with the same key, and everyone who hears an output hears
// that one.
func TestRedteam3HerdWaitingOnDeadCall(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Hour)
			ref := e.ref(t, "dead", "1", tool)
			dctx, die := context.WithCancel(ctx)
			_, err := e.g.Task("acme", "dead").Call(dctx, "1", tool, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				out, _ := e.c.fn(ctx, inv)
				die()
				return out, ctx.Err()
			}, nil)
			require.Error(t, err)
			require.Equal(t, 1, e.c.Starts(ref))
			const n = 24
			heard := make([]rt3Heard, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					g := e.g
					if i%2 == 1 {
						g = e.other
						heard[i].other = true
					}
					<-start
					heard[i].res, heard[i].err = g.Task("acme", "dead").Call(ctx, "1", tool, rt2Args, e.c.fn, &agent.CallOpts{Wait: 10 * time.Second})
				}(i)
			}
			close(start)
			time.Sleep(200 * time.Millisecond)
			e.b.clock.Advance(rt2Lapse)
			wg.Wait()
			var outs []string
			for i, h := range heard {
				switch {
				case rt3Raw(h.err):
					t.Errorf("goroutine %d heard a raw database error: %v", i, h.err)
				case h.err == nil:
					outs = append(outs, string(h.res.Output))
				case errors.Is(h.err, agent.ErrUncertain) && !tool.AcceptsKey:
				case errors.Is(h.err, ledger.ErrInProgress):
					t.Logf("goroutine %d heard %v", i, h.err)
				default:
					t.Errorf("goroutine %d heard %v", i, h.err)
				}
			}
			if tool.AcceptsKey {
				require.Equal(t, 2, e.c.Starts(ref), "one redrive")
				invs := e.c.Invs(ref)
				require.True(t, invs[1].Redrive)
				require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
				require.NotEmpty(t, outs)
			} else {
				require.Equal(t, 1, e.c.Starts(ref))
				require.Empty(t, outs)
			}
			for _, o := range outs {
				require.JSONEq(t, outs[0], o)
			}
		})
	}
}

// A slow tool outlives its call's lease (Config.CallLease) and another attempt takes
// the call over: the slow attempt hears an *agent.UncertainError that wraps the
// ledger's lease-lost error, and the record is the other attempt's (made again with the
// same key, or reported uncertain). A slow attempt whose lease ran out while nobody took
// the call over records its outcome. A slow attempt that answers "not applied" or a
// definitive failure after the take-over leaves the other attempt's record alone.
func TestRedteam3SlowToolTakenOver(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, mode := range []string{"OtherCompletes", "SameProcessCompletes", "OtherStillRunning", "NobodyTakesOver", "SlowNotApplied", "SlowDefinitive"} {
			if mode == "OtherStillRunning" && !tool.AcceptsKey {
				continue // the other attempt of a tool without a key does not run
			}
			t.Run(tool.Name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt3Setup(t, time.Hour)
				ref := e.ref(t, "slow", "1", tool)
				inside, release := make(chan struct{}), make(chan struct{})
				insideB, releaseB := make(chan struct{}), make(chan struct{})
				fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					n := e.c.start(inv)
					switch n {
					case 1:
						close(inside)
						<-release
						switch mode {
						case "SlowNotApplied":
							return nil, ledger.NotApplied(errors.New("the provider refused the request"))
						case "SlowDefinitive":
							return nil, ledger.Definitive("declined", "the provider declined")
						}
					case 2:
						if mode == "OtherStillRunning" {
							close(insideB)
							<-releaseB
						}
					}
					return rt3Output(inv, n), nil
				}
				type answer struct {
					res agent.Result
					err error
				}
				aDone := make(chan answer, 1)
				go func() {
					res, err := e.g.Task("acme", "slow").Call(ctx, "1", tool, rt2Args, fn, nil)
					aDone <- answer{res, err}
				}()
				<-inside
				e.b.clock.Advance(rt2Lapse)
				if mode == "NobodyTakesOver" {
					close(release)
					a := <-aDone
					require.NoError(t, a.err, "the lease ran out while the tool ran, and nobody took the call over")
					require.False(t, a.res.Replayed)
					rec := e.record(t, ref)
					require.Equal(t, ledger.StateCompleted, rec.State)
					res, err := e.other.Task("acme", "slow").Call(ctx, "1", tool, rt2Args, fn, nil)
					require.NoError(t, err)
					require.True(t, res.Replayed)
					require.JSONEq(t, string(a.res.Output), string(res.Output))
					require.Equal(t, 1, e.c.Starts(ref))
					return
				}
				bGuard := e.other
				if mode == "SameProcessCompletes" {
					bGuard = e.g
				}
				bDone := make(chan answer, 1)
				go func() {
					res, err := bGuard.Task("acme", "slow").Call(ctx, "1", tool, rt2Args, fn, nil)
					bDone <- answer{res, err}
				}()
				var b answer
				if mode == "OtherStillRunning" {
					<-insideB
				} else {
					b = <-bDone
					t.Logf("the other attempt heard %v (%s)", b.err, b.res.Output)
					if tool.AcceptsKey {
						require.NoError(t, b.err)
					} else {
						require.ErrorIs(t, b.err, agent.ErrUncertain)
					}
				}
				close(release)
				a := <-aDone
				t.Logf("the slow attempt heard %v (%s)", a.err, a.res.Output)
				if mode == "OtherStillRunning" {
					close(releaseB)
					b = <-bDone
					require.NoError(t, b.err)
				}
				switch mode {
				case "SlowNotApplied", "SlowDefinitive":
					require.Error(t, a.err, "the slow attempt's call was taken over")
					require.False(t, rt3Raw(a.err), "raw database error: %v", a.err)
				default:
					var unc *agent.UncertainError
					require.ErrorAs(t, a.err, &unc, "the slow attempt's tool acted after another attempt took its call over")
					require.ErrorIs(t, a.err, ledger.ErrLeaseLost)
					require.ErrorIs(t, unc.Err, ledger.ErrLeaseLost)
					require.Equal(t, ref.Key, unc.Call.Key)
				}
				wantStarts := 1
				if tool.AcceptsKey {
					wantStarts = 2
					invs := e.c.Invs(ref)
					require.Len(t, invs, 2)
					require.True(t, invs[1].Redrive)
					require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
				}
				require.Equal(t, wantStarts, e.c.Starts(ref))
				rec := e.record(t, ref)
				require.NotNil(t, rec)
				t.Logf("record %s uncertain=%v attempts=%d", rec.State, rec.Uncertain, rec.Attempts)
				if tool.AcceptsKey {
					require.Equal(t, ledger.StateCompleted, rec.State, "the record is the other attempt's")
				} else {
					require.NotEqual(t, ledger.StateCompleted, rec.State)
					require.NotEqual(t, ledger.StateFailed, rec.State, "a slow attempt's definitive failure overwrote the uncertain record")
				}
				// Every later call, from either process and after any lease, hears the record.
				e.b.clock.Advance(rt2Lapse)
				for _, g := range []*agent.Guard{e.g, e.other} {
					res, err := g.Task("acme", "slow").Call(ctx, "1", tool, rt2Args, fn, nil)
					if tool.AcceptsKey {
						require.NoError(t, err)
						require.True(t, res.Replayed)
						require.JSONEq(t, string(b.res.Output), string(res.Output), "the record is the other attempt's")
					} else {
						require.ErrorIs(t, err, agent.ErrUncertain)
					}
				}
				require.Equal(t, wantStarts, e.c.Starts(ref), "a later call started the tool")
			})
		}
	}
}

// rt3Renew renews task a's claim by kind: a heartbeat, a new call, a new database
// call, or a replay of a call made before (step "0"). It returns the step it called.
func (e rt3Env) renew(t testing.TB, a *agent.Task, kind string, i int) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch kind {
	case "heartbeat":
		err = a.Heartbeat(ctx)
	case "call":
		_, err = a.Call(ctx, "call-"+strconv.Itoa(i), emailAPI, rt2Args, e.c.fn, nil)
	case "calltx":
		_, err = a.CallTx(ctx, "tx-"+strconv.Itoa(i), ticket, rt2Args, e.c.local, nil)
	case "replay":
		var res agent.Result
		res, err = a.Call(ctx, "0", smtpSend, rt2Args, e.c.fn, nil)
		if err == nil {
			require.True(t, res.Replayed)
		}
	}
	require.NoError(t, err, "renewing by %s", kind)
}

// rt3Stale checks that stale owner a is refused on every call, heartbeat and finish,
// and that no tool of it starts, and that its Release leaves the new owner's claim.
func (e rt3Env) stale(t testing.TB, a *agent.Task, label string) {
	t.Helper()
	ctx := context.Background()
	for i, step := range []string{"stale-new", "0"} {
		ref := e.ref(t, a.ID, step, smtpSend)
		before := e.c.Starts(ref)
		_, err := a.Call(ctx, step, smtpSend, rt2Args, e.c.fn, nil)
		require.ErrorIs(t, err, agent.ErrStaleOwner, "%s: the stale owner's call %d", label, i)
		require.Equal(t, before, e.c.Starts(ref), "%s: the stale owner's call started the tool", label)
	}
	_, err := a.Call(ctx, "stale-changed", smtpSend, json.RawMessage(`{"to":"z@example.com"}`), e.c.fn, nil)
	require.Error(t, err)
	require.Zero(t, e.c.Starts(e.ref(t, a.ID, "stale-changed", smtpSend)))
	_, err = a.CallTx(ctx, "stale-tx", ticket, rt2Args, e.c.local, nil)
	require.ErrorIs(t, err, agent.ErrStaleOwner, "%s: the stale owner's database call", label)
	require.Zero(t, e.c.Starts(e.ref(t, a.ID, "stale-tx", ticket)), "%s: the stale owner's database tool ran", label)
	require.ErrorIs(t, a.Heartbeat(ctx), agent.ErrStaleOwner, "%s: heartbeat", label)
	require.ErrorIs(t, a.Finish(ctx, nil), agent.ErrStaleOwner, "%s: finish", label)
	_ = a.Release(ctx)
	_, err = e.g.ClaimTask(ctx, "acme", a.ID, nil)
	require.ErrorIs(t, err, ledger.ErrInProgress, "%s: after the stale owner's Release, the new owner's claim is gone", label)
}

// A claimed task keeps its claim's own lease (ClaimTaskOpts.Lease, shorter or longer
// than Config.TaskLease, or the guard's when none) across heartbeats, calls, database
// calls and replays: a dead agent's task is refused to another agent a second before
// that lease ends and taken over a second after, and the stale owner is then fenced.
func TestRedteam3ClaimLeaseExact(t *testing.T) {
	t.Parallel()
	const taskLease = time.Minute
	for _, lease := range []time.Duration{0, 10 * time.Second, 5 * time.Minute} {
		for _, kind := range []string{"none", "heartbeat", "call", "calltx", "replay"} {
			t.Run(fmt.Sprintf("lease=%v/%s", lease, kind), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt3Setup(t, taskLease)
				var opts *agent.ClaimTaskOpts
				want := taskLease
				if lease > 0 {
					opts, want = &agent.ClaimTaskOpts{Lease: lease}, lease
				}
				id := "lease"
				a, err := e.other.ClaimTask(ctx, "acme", id, opts)
				require.NoError(t, err)
				require.WithinDuration(t, e.b.clock.Now().Add(want), a.LeaseUntil(), time.Millisecond, "the claim's lease")
				_, err = a.Call(ctx, "0", smtpSend, rt2Args, e.c.fn, nil)
				require.NoError(t, err)
				if kind != "none" {
					e.b.clock.Advance(want / 2)
					e.renew(t, a, kind, 1)
					require.WithinDuration(t, e.b.clock.Now().Add(want), a.LeaseUntil(), time.Millisecond, "the lease after renewing by %s", kind)
				}
				e.b.clock.Advance(want - time.Second)
				_, err = e.g.ClaimTask(ctx, "acme", id, nil)
				require.ErrorIs(t, err, ledger.ErrInProgress, "a second before the claim's lease of %v ends", want)
				e.b.clock.Advance(2 * time.Second)
				b, err := e.g.ClaimTask(ctx, "acme", id, nil)
				require.NoError(t, err, "a second after the claim's lease of %v ended", want)
				require.True(t, b.TakenOver)
				require.Equal(t, 2, b.Attempt)
				require.WithinDuration(t, e.b.clock.Now().Add(taskLease), b.LeaseUntil(), time.Millisecond, "the new owner's lease")
				e.stale(t, a, "stale owner")
				// The new owner replays the dead agent's call and keeps its own lease.
				res, err := b.Call(ctx, "0", smtpSend, rt2Args, e.c.fn, nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, 1, e.c.Starts(e.ref(t, id, "0", smtpSend)))
				require.WithinDuration(t, e.b.clock.Now().Add(taskLease), b.LeaseUntil(), time.Millisecond)
				require.NoError(t, b.Finish(ctx, nil))
				_, err = e.other.ClaimTask(ctx, "acme", id, opts)
				require.ErrorIs(t, err, agent.ErrTaskDone)
			})
		}
	}
}

// Random timelines of a claimed task with a random lease of its own, with a printed
// seed: its owner renews it by heartbeats, calls, database calls and replays at random
// moves of the clock, and another agent tries to claim it; the claim is refused while
// the lease the model says lives, and taken over once it ended, after which the first
// owner is fenced.
func TestRedteam3RandomClaimLeases(t *testing.T) {
	t.Parallel()
	seed := rt2Seed(t)
	rng := rand.New(rand.NewSource(seed))
	const taskLease = 40 * time.Second
	e := rt3Setup(t, taskLease)
	ctx := context.Background()
	kinds := []string{"heartbeat", "call", "calltx", "replay"}
	for ep := 0; ep < 16; ep++ {
		id := "rnd-" + strconv.Itoa(ep)
		var opts *agent.ClaimTaskOpts
		lease := taskLease
		if rng.Intn(3) > 0 {
			lease = time.Duration(5+rng.Intn(120)) * time.Second
			opts = &agent.ClaimTaskOpts{Lease: lease}
		}
		a, err := e.other.ClaimTask(ctx, "acme", id, opts)
		require.NoError(t, err)
		end := e.b.clock.Now().Add(lease)
		_, err = a.Call(ctx, "0", smtpSend, rt2Args, e.c.fn, nil)
		require.NoError(t, err)
		var log []string
		for op := 0; ; op++ {
			require.Less(t, op, 200)
			e.b.clock.Advance(time.Duration(1+rng.Intn(int(lease/time.Second)+10)) * time.Second)
			if d := e.b.clock.Now().Sub(end); d > -time.Second && d < time.Second {
				e.b.clock.Advance(2 * time.Second)
			}
			live := e.b.clock.Now().Before(end)
			label := fmt.Sprintf("episode %d (lease %v): %s", ep, lease, strings.Join(log, ", "))
			if live && rng.Intn(3) > 0 {
				kind := kinds[rng.Intn(len(kinds))]
				e.renew(t, a, kind, op)
				end = e.b.clock.Now().Add(lease)
				require.WithinDuration(t, end, a.LeaseUntil(), time.Millisecond, "%s: the lease after %s", label, kind)
				log = append(log, kind)
				continue
			}
			b, err := e.g.ClaimTask(ctx, "acme", id, nil)
			if live {
				require.ErrorIs(t, err, ledger.ErrInProgress, "%s: a claim %v before the lease ends", label, end.Sub(e.b.clock.Now()))
				log = append(log, "refused claim")
				continue
			}
			require.NoError(t, err, "%s: a claim %v after the lease ended", label, e.b.clock.Now().Sub(end))
			require.True(t, b.TakenOver)
			e.stale(t, a, label)
			require.NoError(t, b.Finish(ctx, nil))
			break
		}
	}
}

// An agent process runs 24 claimed tasks at once on one pool (of 16 connections), each
// with a loop of tool calls and, beside it, a goroutine that heartbeats the task, as
// ClaimTask's documentation asks. Every call and heartbeat answers (each bounded by a
// 10 s deadline so a hang is heard as one), and each call's tool starts once.
func TestRedteam3HeartbeatBesideCallsManyTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt3Setup(t, time.Minute)
	const tasks, steps = 24, 3
	var wg sync.WaitGroup
	var failed atomic.Int32
	var mu sync.Mutex
	var heard []string
	note := func(format string, args ...any) {
		failed.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(heard) < 8 {
			heard = append(heard, fmt.Sprintf(format, args...))
		}
	}
	owned := make([]*agent.Task, tasks)
	for i := range owned {
		var err error
		owned[i], err = e.g.ClaimTask(ctx, "acme", "many-"+strconv.Itoa(i), nil)
		require.NoError(t, err)
	}
	start := make(chan struct{})
	for i, task := range owned {
		wg.Add(2)
		go func(i int, task *agent.Task) {
			defer wg.Done()
			<-start
			for k := 0; k < steps; k++ {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := task.Call(cctx, strconv.Itoa(k), emailAPI, rt2Args, e.c.fn, nil)
				cancel()
				if err != nil {
					note("task %d: call %d heard %v", i, k, err)
				}
			}
		}(i, task)
		go func(i int, task *agent.Task) {
			defer wg.Done()
			<-start
			for k := 0; k < steps; k++ {
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := task.Heartbeat(cctx)
				cancel()
				if err != nil {
					note("task %d: heartbeat %d heard %v", i, k, err)
				}
			}
		}(i, task)
	}
	began := time.Now()
	close(start)
	wg.Wait()
	for _, h := range heard {
		t.Error(h)
	}
	require.Zero(t, failed.Load(), "calls and heartbeats that failed (in %v)", time.Since(began))
	for i := range owned {
		for k := 0; k < steps; k++ {
			require.Equal(t, 1, e.c.Starts(e.ref(t, "many-"+strconv.Itoa(i), strconv.Itoa(k), emailAPI)))
		}
	}
}

var (
	rt3ArgsA        = json.RawMessage(`{"to":"a@example.com","n":1}`)
	rt3ArgsAReorder = json.RawMessage(`{"n":1,"to":"a@example.com"}`)
	rt3ArgsB        = json.RawMessage(`{"to":"b@example.com","n":2}`)
)

// rt3ArgsOf are the arguments of goroutine i of a race: A, A in another member order,
// or B.
func rt3ArgsOf(i int) json.RawMessage {
	return []json.RawMessage{rt3ArgsA, rt3ArgsB, rt3ArgsAReorder}[i%3]
}

// 24 goroutines of two processes make the first call at one place at once, a third with
// other arguments: the tool starts once, with the winner's arguments; everyone with the
// winner's arguments (in any member order) hears its output, and everyone else an
// *agent.ArgumentsChangedError that carries both argument sets.
func TestRedteam3ChangedArgsRace(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI, ticket} {
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			t.Run(fmt.Sprintf("%s/wait=%v", tool.Name, wait), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt3Setup(t, time.Hour)
				ref := e.ref(t, "race", "1", tool)
				const n = 24
				heard := make([]rt3Heard, n)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						g := e.g
						if i%2 == 1 {
							g, heard[i].other = e.other, true
						}
						task := g.Task("acme", "race")
						<-start
						if tool == ticket {
							heard[i].res, heard[i].err = task.CallTx(ctx, "1", tool, rt3ArgsOf(i), e.c.local, &agent.CallOpts{Wait: wait})
						} else {
							heard[i].res, heard[i].err = task.Call(ctx, "1", tool, rt3ArgsOf(i), e.c.fn, &agent.CallOpts{Wait: wait})
						}
					}(i)
				}
				close(start)
				wg.Wait()
				require.Equal(t, 1, e.c.Starts(ref), "the tool's starts")
				won := e.c.Invs(ref)[0].Args
				want := rt3Output(e.c.Invs(ref)[0], 1)
				t.Logf("the winner's arguments: %s", won)
				for i, h := range heard {
					mine := rt3ArgsOf(i)
					same := rt2JSONEq(mine, won)
					switch {
					case rt3Raw(h.err):
						t.Errorf("goroutine %d heard a raw database error: %v", i, h.err)
					case h.err == nil:
						if !same {
							t.Errorf("goroutine %d called with %s and heard an output (%s) of the call with %s", i, mine, h.res.Output, won)
						} else if !rt2JSONEq(h.res.Output, want) {
							t.Errorf("goroutine %d heard %s, the tool answered %s", i, h.res.Output, want)
						}
					case errors.Is(h.err, ledger.ErrInProgress) && wait == 0:
					case same:
						t.Errorf("goroutine %d called with the winner's arguments and heard %v", i, h.err)
					default:
						var ch *agent.ArgumentsChangedError
						if !errors.As(h.err, &ch) {
							t.Errorf("goroutine %d called with other arguments and heard %v", i, h.err)
						} else if !rt2JSONEq(ch.Stored, won) || !rt2JSONEq(ch.New, mine) {
							t.Errorf("goroutine %d: the refusal carries stored %s and new %s; the arguments were %s and %s", i, ch.Stored, ch.New, won, mine)
						}
					}
				}
				// Later, each set of arguments hears the same from either process.
				for _, g := range []*agent.Guard{e.g, e.other} {
					for i := 0; i < 3; i++ {
						var res agent.Result
						var err error
						if tool == ticket {
							res, err = g.Task("acme", "race").CallTx(ctx, "1", tool, rt3ArgsOf(i), e.c.local, nil)
						} else {
							res, err = g.Task("acme", "race").Call(ctx, "1", tool, rt3ArgsOf(i), e.c.fn, nil)
						}
						if rt2JSONEq(rt3ArgsOf(i), won) {
							require.NoError(t, err)
							require.True(t, res.Replayed)
							require.JSONEq(t, string(want), string(res.Output))
						} else {
							require.ErrorIs(t, err, agent.ErrArgumentsChanged)
						}
					}
				}
				require.Equal(t, 1, e.c.Starts(ref))
			})
		}
	}
}

var rt3Refund = agent.Tool{Name: "refund", NeedsApproval: true}

// 24 goroutines of two processes make the first call of a tool that needs approval at
// one place at once, a third with other arguments: one call is frozen, and Waiting lists
// it alone; everyone with its arguments hears it pending with one deadline, everyone
// else hears the arguments changed. A rejection then refuses every attempt, and the tool
// never starts.
func TestRedteam3FreezeRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt3Setup(t, time.Hour)
	ref := e.ref(t, "freeze", "1", rt3Refund)
	const n = 24
	heard := make([]rt3Heard, n)
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
			heard[i].res, heard[i].err = g.Task("acme", "freeze").Call(ctx, "1", rt3Refund, rt3ArgsOf(i), e.c.fn, &agent.CallOpts{Wait: 10 * time.Second})
		}(i)
	}
	close(start)
	wg.Wait()
	w, err := e.g.Waiting(ctx, "acme", 100)
	require.NoError(t, err)
	require.Len(t, w, 1, "frozen calls")
	f := w[0]
	require.Equal(t, ref.Key, f.Call.Key)
	var deadline time.Time
	for i, h := range heard {
		mine := rt3ArgsOf(i)
		var pend *agent.ApprovalPendingError
		var ch *agent.ArgumentsChangedError
		switch {
		case rt3Raw(h.err):
			t.Errorf("goroutine %d heard a raw database error: %v", i, h.err)
		case errors.As(h.err, &pend):
			if !rt2JSONEq(mine, f.Args) {
				t.Errorf("goroutine %d called with %s and heard pending; the frozen call has %s", i, mine, f.Args)
			}
			if deadline.IsZero() {
				deadline = pend.Deadline
			}
			if !pend.Deadline.Equal(deadline) || !pend.Deadline.Equal(f.Deadline) {
				t.Errorf("goroutine %d heard the deadline %v; another heard %v, Waiting lists %v", i, pend.Deadline, deadline, f.Deadline)
			}
		case errors.As(h.err, &ch):
			if rt2JSONEq(mine, f.Args) || !rt2JSONEq(ch.Stored, f.Args) {
				t.Errorf("goroutine %d called with %s and heard the arguments changed (stored %s); the frozen call has %s", i, mine, ch.Stored, f.Args)
			}
		default:
			t.Errorf("goroutine %d heard %v", i, h.err)
		}
	}
	require.Zero(t, e.c.Starts(ref))
	require.NoError(t, e.other.Reject(ctx, f, "ops", "no"))
	for i := 0; i < 3; i++ {
		_, err := e.g.Task("acme", "freeze").Call(ctx, "1", rt3Refund, rt3ArgsOf(i), e.c.fn, nil)
		require.Error(t, err)
		if rt2JSONEq(rt3ArgsOf(i), f.Args) {
			var rej *agent.RejectedError
			require.ErrorAs(t, err, &rej)
			require.False(t, rej.TimedOut)
			require.Equal(t, "ops", rej.By)
		}
	}
	require.Zero(t, e.c.Starts(ref))
}

// A person approves a frozen call while 24 goroutines of two processes retry it, a
// third of them with other arguments, polling while it is pending. The approval applies
// to the arguments the person saw: the tool starts once, with them; the other arguments
// are refused before and after it; everyone who hears an output hears the same.
func TestRedteam3ApproveWhileChangedRetryRaces(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{rt3Refund, {Name: "refund_api", NeedsApproval: true, AcceptsKey: true}} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Hour)
			ref := e.ref(t, "approve", "1", tool)
			_, err := e.g.Task("acme", "approve").Call(ctx, "1", tool, rt3ArgsA, e.c.fn, nil)
			require.ErrorIs(t, err, agent.ErrApprovalPending)
			w, err := e.g.Waiting(ctx, "acme", 10)
			require.NoError(t, err)
			require.Len(t, w, 1)
			f := w[0]
			const n = 24
			heard := make([]rt3Heard, n)
			pendings := make([]int, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			var approveErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				time.Sleep(20 * time.Millisecond)
				approveErr = e.other.Approve(ctx, f, "ops", "ok")
			}()
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					g := e.g
					if i%2 == 1 {
						g = e.other
					}
					<-start
					for try := 0; try < 400; try++ {
						heard[i].res, heard[i].err = g.Task("acme", "approve").Call(ctx, "1", tool, rt3ArgsOf(i), e.c.fn, &agent.CallOpts{Wait: 10 * time.Second})
						if !errors.Is(heard[i].err, agent.ErrApprovalPending) {
							return
						}
						pendings[i]++
						time.Sleep(5 * time.Millisecond)
					}
				}(i)
			}
			close(start)
			wg.Wait()
			require.NoError(t, approveErr)
			require.Equal(t, 1, e.c.Starts(ref), "the approved call's starts")
			require.True(t, rt2JSONEq(e.c.Invs(ref)[0].Args, rt3ArgsA), "the tool ran with %s", e.c.Invs(ref)[0].Args)
			want := rt3Output(e.c.Invs(ref)[0], 1)
			for i, h := range heard {
				mine := rt3ArgsOf(i)
				switch {
				case rt3Raw(h.err):
					t.Errorf("goroutine %d heard a raw database error: %v", i, h.err)
				case rt2JSONEq(mine, rt3ArgsA):
					if h.err != nil || !rt2JSONEq(h.res.Output, want) {
						t.Errorf("goroutine %d (approved arguments) heard %v, %s after %d pending answers", i, h.err, h.res.Output, pendings[i])
					}
				default:
					var ch *agent.ArgumentsChangedError
					if !errors.As(h.err, &ch) || pendings[i] > 0 {
						t.Errorf("goroutine %d (other arguments) heard %v after %d pending answers", i, h.err, pendings[i])
					}
				}
			}
			require.ErrorIs(t, e.g.Approve(ctx, f, "ops", "again"), agent.ErrNotWaiting)
			w, err = e.g.Waiting(ctx, "acme", 10)
			require.NoError(t, err)
			require.Empty(t, w)
			require.Equal(t, 1, e.c.Starts(ref))
		})
	}
}

// A person approves a frozen call while the clock passes its approval deadline. The
// decision holds if it was made: then the call runs once; else the approval is refused
// and every attempt hears a rejection that timed out. Other arguments never run.
func TestRedteam3ApprovalTimeoutRace(t *testing.T) {
	t.Parallel()
	seed := rt2Seed(t)
	rng := rand.New(rand.NewSource(seed))
	ctx := context.Background()
	e := rt3Setup(t, time.Hour)
	// The guards of rt3Setup have the default approval timeout: move the clock past it.
	const past = agent.ApprovalTimeoutDefault + time.Hour
	outcomes := map[string]int{}
	for round := 0; round < 16; round++ {
		id := "timeout-" + strconv.Itoa(round)
		ref := e.ref(t, id, "1", rt3Refund)
		_, err := e.g.Task("acme", id).Call(ctx, "1", rt3Refund, rt3ArgsA, e.c.fn, nil)
		require.ErrorIs(t, err, agent.ErrApprovalPending)
		w, err := e.g.Waiting(ctx, "acme", 10)
		require.NoError(t, err)
		require.Len(t, w, 1)
		var approveErr error
		var wg sync.WaitGroup
		// One of the two goes first by a random delay of up to 3 ms.
		delay := time.Duration(rng.Intn(3000)) * time.Microsecond
		approveFirst := rng.Intn(2) == 0
		wg.Add(2)
		go func() {
			defer wg.Done()
			if !approveFirst {
				time.Sleep(delay)
			}
			approveErr = e.other.Approve(ctx, w[0], "ops", "ok")
		}()
		go func() {
			defer wg.Done()
			if approveFirst {
				time.Sleep(delay)
			}
			e.b.clock.Advance(past)
		}()
		wg.Wait()
		_, errB := e.g.Task("acme", id).Call(ctx, "1", rt3Refund, rt3ArgsB, e.c.fn, nil)
		require.Error(t, errB)
		res, err := e.other.Task("acme", id).Call(ctx, "1", rt3Refund, rt3ArgsA, e.c.fn, nil)
		if approveErr == nil {
			outcomes["approved"]++
			require.NoError(t, err, "round %d: approved before its deadline", round)
			require.False(t, res.Replayed)
			require.Equal(t, 1, e.c.Starts(ref))
		} else {
			outcomes["timed out"]++
			require.ErrorIs(t, approveErr, agent.ErrNotWaiting, "round %d", round)
			var rej *agent.RejectedError
			require.ErrorAs(t, err, &rej, "round %d", round)
			require.True(t, rej.TimedOut)
			require.Zero(t, e.c.Starts(ref))
		}
		w, err = e.g.Waiting(ctx, "acme", 10)
		require.NoError(t, err)
		require.Empty(t, w)
	}
	t.Logf("outcomes: %v", outcomes)
}

// While one attempt holds a call (its tool runs), other attempts of both processes wait
// for it with CallOpts.Wait longer than their contexts' deadlines. Each returns by its
// deadline, with the deadline or "in progress" (never uncertain, never a database
// error), or with the holder's output if it finished first; the tool starts once and
// the holder records its output. Random deadlines and holder times, with a printed seed.
func TestRedteam3DeadlineShorterThanWait(t *testing.T) {
	t.Parallel()
	seed := rt2Seed(t)
	for _, claimed := range []bool{false, true} {
		for _, tool := range []agent.Tool{smtpSend, emailAPI} {
			t.Run(fmt.Sprintf("%s/claimed=%v", tool.Name, claimed), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewSource(seed))
				ctx := context.Background()
				e := rt3Setup(t, time.Hour)
				for round := 0; round < 4; round++ {
					id := "deadline-" + strconv.Itoa(round)
					ref := e.ref(t, id, "1", tool)
					holder := e.g.Task("acme", id)
					if claimed {
						var err error
						holder, err = e.g.ClaimTask(ctx, "acme", id, nil)
						require.NoError(t, err)
					}
					hold := time.Duration(rng.Intn(400)) * time.Millisecond
					inside := make(chan struct{})
					fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
						n := e.c.start(inv)
						if n == 1 {
							close(inside)
							time.Sleep(hold)
						}
						return rt3Output(inv, n), nil
					}
					type answer struct {
						res agent.Result
						err error
					}
					hDone := make(chan answer, 1)
					go func() {
						res, err := holder.Call(ctx, "1", tool, rt2Args, fn, nil)
						hDone <- answer{res, err}
					}()
					<-inside
					const n = 12
					heard := make([]rt3Heard, n)
					took := make([]time.Duration, n)
					deadlines := make([]time.Duration, n)
					var wg sync.WaitGroup
					for i := 0; i < n; i++ {
						deadlines[i] = time.Duration(10+rng.Intn(300)) * time.Millisecond
						wg.Add(1)
						go func(i int) {
							defer wg.Done()
							task := holder
							if !claimed && i%2 == 1 {
								task = e.other.Task("acme", id)
							}
							cctx, cancel := context.WithTimeout(ctx, deadlines[i])
							defer cancel()
							began := time.Now()
							heard[i].res, heard[i].err = task.Call(cctx, "1", tool, rt2Args, fn, &agent.CallOpts{Wait: time.Minute})
							took[i] = time.Since(began)
						}(i)
					}
					wg.Wait()
					h := <-hDone
					require.NoError(t, h.err, "round %d: the holder", round)
					label := fmt.Sprintf("round %d (holder %v)", round, hold)
					for i, x := range heard {
						if took[i] > deadlines[i]+3*time.Second {
							t.Errorf("%s: waiter %d with a deadline of %v returned after %v", label, i, deadlines[i], took[i])
						}
						switch {
						case rt3Raw(x.err):
							t.Errorf("%s: waiter %d heard a raw database error: %v", label, i, x.err)
						case x.err == nil:
							if !rt2JSONEq(x.res.Output, h.res.Output) {
								t.Errorf("%s: waiter %d heard %s, the holder %s", label, i, x.res.Output, h.res.Output)
							}
						case errors.Is(x.err, agent.ErrUncertain):
							t.Errorf("%s: waiter %d (deadline %v) heard %v", label, i, deadlines[i], x.err)
						case errors.Is(x.err, context.DeadlineExceeded), errors.Is(x.err, ledger.ErrInProgress):
						case errors.Is(x.err, ledger.ErrOutcomeUnknown):
							t.Logf("%s: waiter %d (deadline %v) heard %v", label, i, deadlines[i], x.err)
						default:
							t.Errorf("%s: waiter %d (deadline %v) heard %v", label, i, deadlines[i], x.err)
						}
					}
					require.Equal(t, 1, e.c.Starts(ref), "%s: starts", label)
					for _, task := range []*agent.Task{holder, e.g.Task("acme", id), e.other.Task("acme", id)} {
						if claimed && task != holder {
							continue
						}
						res, err := task.Call(ctx, "1", tool, rt2Args, fn, nil)
						require.NoError(t, err, label)
						require.True(t, res.Replayed)
						require.JSONEq(t, string(h.res.Output), string(res.Output))
					}
					require.Equal(t, 1, e.c.Starts(ref), "%s: starts after the waiters' retries", label)
					if claimed {
						require.NoError(t, holder.Finish(ctx, nil))
					}
				}
			})
		}
	}
}

// Each round trip of a heartbeat is cut in turn (the server runs it, the owner hears
// nothing): the owner still owns the task: another agent is refused it, its calls run,
// its next heartbeat and its finish succeed.
func TestRedteam3LostHeartbeatAnswer(t *testing.T) {
	t.Parallel()
	for _, lease := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			var opts *agent.ClaimTaskOpts
			if lease > 0 {
				opts = &agent.ClaimTaskOpts{Lease: lease}
			}
			for n := 1; ; n++ {
				require.Less(t, n, 20)
				id := "hb-" + strconv.Itoa(n)
				a, err := e.g.ClaimTask(ctx, "acme", id, opts)
				require.NoError(t, err)
				e.px.Arm(faultproxy.CutAfter, n, true)
				err = a.Heartbeat(ctx)
				fired, at := e.px.Disarm()
				if fired {
					e.px.Settle(t, e.b.pool)
				}
				label := fmt.Sprintf("heartbeat cut after round trip %d (%.80q)", n, at)
				t.Logf("%s: heard %v", label, err)
				require.False(t, rt3Raw(err) && !errors.Is(err, ledger.ErrOutcomeUnknown), "%s: raw database error %v", label, err)
				_, errC := e.other.ClaimTask(ctx, "acme", id, nil)
				require.ErrorIs(t, errC, ledger.ErrInProgress, "%s: another agent while the owner's claim lives", label)
				res, err := a.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
				require.NoError(t, err, "%s: the owner's call", label)
				require.False(t, res.Replayed)
				require.NoError(t, a.Heartbeat(ctx), label)
				require.NoError(t, a.Finish(ctx, nil), label)
				require.Equal(t, 1, e.c.Starts(e.ref(t, id, "1", smtpSend)))
				if !fired {
					break
				}
			}
		})
	}
}

// Each round trip of ClaimTask is cut in turn, and the same process claims the task
// again, at once and after the lease. Nobody hears a database error; the task is
// claimed by exactly one agent in the end, and its calls run once.
func TestRedteam3LostClaimTaskAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt3Setup(t, time.Minute)
	for n := 1; ; n++ {
		require.Less(t, n, 20)
		id := "ct-" + strconv.Itoa(n)
		e.px.Arm(faultproxy.CutAfter, n, true)
		a, err := e.g.ClaimTask(ctx, "acme", id, nil)
		fired, at := e.px.Disarm()
		if fired {
			e.px.Settle(t, e.b.pool)
		}
		label := fmt.Sprintf("ClaimTask cut after round trip %d (%.80q)", n, at)
		if err == nil {
			t.Logf("%s: heard success", label)
		} else {
			require.False(t, rt3Raw(err) && !errors.Is(err, ledger.ErrOutcomeUnknown), "%s: raw database error %v", label, err)
			a2, err2 := e.g.ClaimTask(ctx, "acme", id, nil)
			t.Logf("%s: heard %v; the same process's retry at once heard %v", label, err, err2)
			if errors.Is(err, ledger.ErrOutcomeUnknown) {
				// The process knows the token of its claim whose answer was lost, and resumes it.
				require.NoError(t, err2, "%s: the same process's retry after an unknown outcome", label)
			}
			if err2 != nil {
				require.ErrorIs(t, err2, ledger.ErrInProgress, label)
				e.b.clock.Advance(2 * time.Minute)
				a2, err2 = e.g.ClaimTask(ctx, "acme", id, nil)
				require.NoError(t, err2, "%s: after the lease", label)
			}
			a = a2
		}
		_, err = e.other.ClaimTask(ctx, "acme", id, nil)
		require.ErrorIs(t, err, ledger.ErrInProgress, label)
		_, err = a.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
		require.NoError(t, err, label)
		require.NoError(t, a.Finish(ctx, nil), label)
		require.Equal(t, 1, e.c.Starts(e.ref(t, id, "1", smtpSend)))
		if !fired {
			break
		}
	}
}

// A dead agent's task whose lease lapsed is claimed by 24 goroutines of two processes at
// once: one takes it over, the others hear it in progress, nobody hears a database
// error; the dead agent is fenced, and the winner replays its completed call.
func TestRedteam3ConcurrentTakeOverClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt3Setup(t, time.Minute)
	for round := 0; round < 4; round++ {
		id := "takeover-" + strconv.Itoa(round)
		a, err := e.other.ClaimTask(ctx, "acme", id, &agent.ClaimTaskOpts{Lease: 10 * time.Second})
		require.NoError(t, err)
		first, err := a.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
		require.NoError(t, err)
		e.b.clock.Advance(11 * time.Second)
		const n = 24
		tasks := make([]*agent.Task, n)
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
				tasks[i], errs[i] = g.ClaimTask(ctx, "acme", id, nil)
			}(i)
		}
		close(start)
		wg.Wait()
		var winner *agent.Task
		for i, err := range errs {
			switch {
			case err == nil:
				require.Nil(t, winner, "round %d: a second agent took the task over", round)
				winner = tasks[i]
			case rt3Raw(err):
				t.Errorf("round %d: goroutine %d heard a raw database error: %v", round, i, err)
			case !errors.Is(err, ledger.ErrInProgress):
				t.Errorf("round %d: goroutine %d heard %v", round, i, err)
			}
		}
		require.NotNil(t, winner, "round %d: nobody took the task over", round)
		require.True(t, winner.TakenOver)
		require.Equal(t, 2, winner.Attempt)
		e.stale(t, a, fmt.Sprintf("round %d", round))
		res, err := winner.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.JSONEq(t, string(first.Output), string(res.Output))
		require.NoError(t, winner.Finish(ctx, nil))
	}
}

// An owner releases its task while one of its tools runs; another agent claims the task
// at once and makes the same call while the first's call lease lives, then after the
// first call returned. The tool starts once, and what the first owner heard is what the
// new owner replays.
func TestRedteam3ReleaseDuringCall(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			a, err := e.g.ClaimTask(ctx, "acme", "release", nil)
			require.NoError(t, err)
			ref := e.ref(t, "release", "1", tool)
			var b *agent.Task
			var errB, errB2 error
			fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				n := e.c.start(inv)
				if n == 1 {
					require.NoError(t, a.Release(ctx))
					b, errB = e.other.ClaimTask(ctx, "acme", "release", nil)
					if errB == nil {
						_, errB2 = b.Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
					}
				}
				return rt3Output(inv, n), nil
			}
			resA, errA := a.Call(ctx, "1", tool, rt2Args, fn, nil)
			require.NoError(t, errB, "a claim right after the owner released the task")
			require.ErrorIs(t, errB2, ledger.ErrInProgress, "the first owner's call lease lives")
			t.Logf("the first owner heard %v (%s)", errA, resA.Output)
			res, err := b.Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
			if errA == nil {
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.JSONEq(t, string(resA.Output), string(res.Output))
			} else {
				require.False(t, rt3Raw(errA), "raw database error: %v", errA)
				if err == nil {
					require.True(t, res.Replayed)
				}
			}
			require.Equal(t, 1, e.c.Starts(ref))
			require.NoError(t, b.Finish(ctx, nil))
		})
	}
}

// After a claim's answer is lost, goroutines of the process that lost it retry the call,
// half with the same arguments and half with others, at once: the others are refused
// with both argument sets and leave the claim to resume; the tool starts once, with the
// first arguments, as the first attempt.
func TestRedteam3LostClaimChangedArgsHerd(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, lapse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lapse=%v", tool.Name, lapse), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt3Setup(t, time.Hour)
				task := e.g.Task("acme", "lostchanged")
				ref := e.ref(t, "lostchanged", "1", tool)
				e.loseClaim(t, task, "1", tool, rt3ArgsA)
				if lapse {
					e.b.clock.Advance(rt2Lapse)
				}
				const n = 24
				heard := make([]rt3Heard, n)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						tk := task
						if i%4 >= 2 {
							tk = e.g.Task("acme", "lostchanged")
						}
						<-start
						heard[i].res, heard[i].err = tk.Call(ctx, "1", tool, rt3ArgsOf(i), e.c.fn, &agent.CallOpts{Wait: 10 * time.Second})
					}(i)
				}
				close(start)
				wg.Wait()
				require.Equal(t, 1, e.c.Starts(ref))
				inv := e.c.Invs(ref)[0]
				require.True(t, rt2JSONEq(inv.Args, rt3ArgsA))
				require.Equal(t, 1, inv.Attempt)
				require.False(t, inv.Redrive)
				want := rt3Output(inv, 1)
				for i, h := range heard {
					mine := rt3ArgsOf(i)
					if rt2JSONEq(mine, rt3ArgsA) {
						if h.err != nil || !rt2JSONEq(h.res.Output, want) {
							t.Errorf("goroutine %d (first arguments) heard %v, %s", i, h.err, h.res.Output)
						}
						continue
					}
					var ch *agent.ArgumentsChangedError
					if !errors.As(h.err, &ch) || !rt2JSONEq(ch.Stored, rt3ArgsA) || !rt2JSONEq(ch.New, mine) {
						t.Errorf("goroutine %d (other arguments) heard %v", i, h.err)
					}
				}
			})
		}
	}
}

// A slow tool returns while, at the same moment, another attempt (of the same process or
// another) takes its lapsed call over: random delays on both sides, with a printed
// seed. What the slow attempt heard agrees with the record: success only if its output
// is the one stored and replayed; else an *agent.UncertainError that wraps the lease-lost
// error, with the other attempt's record. Nobody hears a database error, and a tool
// without a key starts once.
func TestRedteam3RandomSlowTakeoverRace(t *testing.T) {
	t.Parallel()
	seed := rt2Seed(t)
	rng := rand.New(rand.NewSource(seed))
	ctx := context.Background()
	e := rt3Setup(t, time.Hour)
	tally := map[string]int{}
	for round := 0; round < 30; round++ {
		id := "slowrace-" + strconv.Itoa(round)
		tool := []agent.Tool{smtpSend, emailAPI}[rng.Intn(2)]
		ref := e.ref(t, id, "1", tool)
		bGuard := []*agent.Guard{e.g, e.other}[rng.Intn(2)]
		delayA := time.Duration(rng.Intn(4000)) * time.Microsecond
		delayB := time.Duration(rng.Intn(4000)) * time.Microsecond
		label := fmt.Sprintf("round %d (%s, other process %v, delays %v/%v)", round, tool.Name, bGuard == e.other, delayA, delayB)
		inside, release := make(chan struct{}), make(chan struct{})
		fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
			n := e.c.start(inv)
			if n == 1 {
				close(inside)
				<-release
				time.Sleep(delayA)
			}
			return rt3Output(inv, n), nil
		}
		type answer struct {
			res agent.Result
			err error
		}
		aDone, bDone := make(chan answer, 1), make(chan answer, 1)
		go func() {
			res, err := e.g.Task("acme", id).Call(ctx, "1", tool, rt2Args, fn, nil)
			aDone <- answer{res, err}
		}()
		<-inside
		e.b.clock.Advance(rt2Lapse)
		go func() {
			time.Sleep(delayB)
			res, err := bGuard.Task("acme", id).Call(ctx, "1", tool, rt2Args, fn, &agent.CallOpts{Wait: 10 * time.Second})
			bDone <- answer{res, err}
		}()
		close(release)
		a, b := <-aDone, <-bDone
		for _, x := range []answer{a, b} {
			require.False(t, rt3Raw(x.err), "%s: raw database error %v", label, x.err)
		}
		starts := e.c.Starts(ref)
		rec := e.record(t, ref)
		require.NotNil(t, rec, label)
		state := fmt.Sprintf("A heard %v (%s), B heard %v (%s, replayed %v), starts %d, record %s uncertain=%v", a.err, a.res.Output, b.err, b.res.Output, b.res.Replayed, starts, rec.State, rec.Uncertain)
		switch {
		case a.err == nil:
			tally["slow recorded"]++
			require.Equal(t, ledger.StateCompleted, rec.State, "%s: %s", label, state)
			require.Equal(t, 1, starts, "%s: %s", label, state)
			require.NoError(t, b.err, "%s: %s", label, state)
			require.True(t, b.res.Replayed, "%s: %s", label, state)
			require.JSONEq(t, string(a.res.Output), string(b.res.Output), "%s: %s", label, state)
		default:
			tally["taken over"]++
			var unc *agent.UncertainError
			require.ErrorAs(t, a.err, &unc, "%s: %s", label, state)
			require.ErrorIs(t, a.err, ledger.ErrLeaseLost, "%s: %s", label, state)
			if tool.AcceptsKey {
				require.NoError(t, b.err, "%s: %s", label, state)
				require.Equal(t, 2, starts, "%s: %s", label, state)
				require.Equal(t, ledger.StateCompleted, rec.State, "%s: %s", label, state)
			} else {
				require.ErrorIs(t, b.err, agent.ErrUncertain, "%s: %s", label, state)
				require.Equal(t, 1, starts, "%s: %s", label, state)
			}
		}
		// A later call from either process hears the record.
		for _, g := range []*agent.Guard{e.g, e.other} {
			res, err := g.Task("acme", id).Call(ctx, "1", tool, rt2Args, fn, nil)
			if rec.State == ledger.StateCompleted {
				require.NoError(t, err, "%s: %s", label, state)
				require.True(t, res.Replayed)
				want := a.res.Output
				if a.err != nil {
					want = b.res.Output
				}
				require.JSONEq(t, string(want), string(res.Output), "%s: %s", label, state)
			} else {
				require.ErrorIs(t, err, agent.ErrUncertain, "%s: %s", label, state)
			}
		}
		require.Equal(t, starts, e.c.Starts(ref), label)
	}
	t.Logf("outcomes: %v", tally)
}

// An agent process runs 24 claimed tasks at once on one pool (of 16 connections); each
// task's loop makes calls while another goroutine finishes the task, or releases it.
// Every call and the finish answer within a 10 s deadline: a call hears its output, or,
// once the task is finished or released, a refusal; a refused call starts no tool.
func TestRedteam3EndBesideCallsManyTasks(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"Finish", "Release"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			const tasks, steps = 24, 4
			var wg sync.WaitGroup
			var failed atomic.Int32
			var mu sync.Mutex
			var heard []string
			note := func(format string, args ...any) {
				failed.Add(1)
				mu.Lock()
				defer mu.Unlock()
				if len(heard) < 8 {
					heard = append(heard, fmt.Sprintf(format, args...))
				}
			}
			for round := 0; round < 4; round++ {
				owned := make([]*agent.Task, tasks)
				for i := range owned {
					var err error
					owned[i], err = e.g.ClaimTask(ctx, "acme", "end-"+strconv.Itoa(round)+"-"+strconv.Itoa(i), nil)
					require.NoError(t, err)
				}
				okCalls := make([][]bool, tasks)
				start := make(chan struct{})
				for i, task := range owned {
					okCalls[i] = make([]bool, steps)
					wg.Add(2)
					go func(i int, task *agent.Task) {
						defer wg.Done()
						<-start
						for k := 0; k < steps; k++ {
							cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
							_, err := task.Call(cctx, strconv.Itoa(k), emailAPI, rt2Args, e.c.fn, nil)
							cancel()
							switch {
							case err == nil:
								okCalls[i][k] = true
							case errors.Is(err, agent.ErrTaskDone), errors.Is(err, agent.ErrStaleOwner):
							default:
								note("task %d: call %d heard %v", i, k, err)
							}
						}
					}(i, task)
					go func(i int, task *agent.Task) {
						defer wg.Done()
						<-start
						time.Sleep(time.Duration(i%4) * time.Millisecond)
						cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
						defer cancel()
						var err error
						if end == "Finish" {
							err = task.Finish(cctx, nil)
						} else {
							err = task.Release(cctx)
						}
						if err != nil {
							note("task %d: %s heard %v", i, end, err)
						}
					}(i, task)
				}
				close(start)
				wg.Wait()
				for _, h := range heard {
					t.Error(h)
				}
				require.Zero(t, failed.Load(), "round %d: calls and ends that failed", round)
				for i := range owned {
					for k := 0; k < steps; k++ {
						s := e.c.Starts(e.ref(t, "end-"+strconv.Itoa(round)+"-"+strconv.Itoa(i), strconv.Itoa(k), emailAPI))
						if okCalls[i][k] {
							require.Equal(t, 1, s, "task %d call %d", i, k)
						} else {
							require.Zero(t, s, "task %d call %d was refused", i, k)
						}
					}
				}
			}
		})
	}
}

// A claim's answer is lost; the same process resumes it, and its tool acts and then its
// agent dies (the context ends before the output is recorded). Then 24 goroutines of the
// same process (through the task and other values of it) and of another retry, before
// and after the lease: a tool without a key never starts again (the process that lost
// the first claim must not resume it a second time), one with a key is made again once
// with the same key.
func TestRedteam3LostClaimResumedThenCrash(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		for _, lapse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lapse=%v", tool.Name, lapse), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := rt3Setup(t, time.Hour)
				task := e.g.Task("acme", "resumecrash")
				ref := e.ref(t, "resumecrash", "1", tool)
				e.loseClaim(t, task, "1", tool, rt2Args)
				dctx, die := context.WithCancel(ctx)
				_, err := task.Call(dctx, "1", tool, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					out, _ := e.c.fn(ctx, inv)
					die()
					return out, ctx.Err()
				}, nil)
				t.Logf("the resumed call whose agent died heard %v", err)
				require.Error(t, err)
				require.Equal(t, 1, e.c.Starts(ref))
				if !tool.AcceptsKey {
					require.ErrorIs(t, err, agent.ErrUncertain, "the tool acted and nothing was recorded")
				}
				if lapse {
					e.b.clock.Advance(rt2Lapse)
				}
				const n = 24
				heard := make([]rt3Heard, n)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func(i int) {
						defer wg.Done()
						tk := task
						switch i % 3 {
						case 1:
							tk = e.g.Task("acme", "resumecrash")
						case 2:
							tk, heard[i].other = e.other.Task("acme", "resumecrash"), true
						}
						<-start
						heard[i].res, heard[i].err = tk.Call(ctx, "1", tool, rt2Args, e.c.fn, &agent.CallOpts{Wait: 2 * time.Second})
					}(i)
				}
				close(start)
				wg.Wait()
				var outs []string
				for i, h := range heard {
					switch {
					case rt3Raw(h.err):
						t.Errorf("goroutine %d heard a raw database error: %v", i, h.err)
					case h.err == nil:
						outs = append(outs, string(h.res.Output))
					case errors.Is(h.err, agent.ErrUncertain) && !tool.AcceptsKey:
					case errors.Is(h.err, ledger.ErrInProgress):
					default:
						t.Errorf("goroutine %d heard %v", i, h.err)
					}
				}
				switch {
				case !tool.AcceptsKey:
					require.Equal(t, 1, e.c.Starts(ref), "a tool without a key that acted once")
					require.Empty(t, outs)
				case lapse:
					require.Equal(t, 2, e.c.Starts(ref), "one redrive")
					invs := e.c.Invs(ref)
					require.True(t, invs[1].Redrive)
					require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
				default:
					require.LessOrEqual(t, e.c.Starts(ref), 2)
				}
				for _, o := range outs {
					require.JSONEq(t, outs[0], o)
				}
			})
		}
	}
}

// A call's agent dies after its tool acted; once the lease lapsed, another process takes
// the call over, and each round trip of that take-over is cut in turn. Whatever the
// take-over heard, its process's retries and the first process's never start a tool
// without a key again; one with a key is made again at most once, as a redrive with the
// same key; every output heard is the one stored.
func TestRedteam3LostTakeOverAnswer(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Hour)
			for n := 1; ; n++ {
				require.Less(t, n, 30)
				id := "lost-takeover-" + strconv.Itoa(n)
				ref := e.ref(t, id, "1", tool)
				dctx, die := context.WithCancel(ctx)
				_, err := e.other.Task("acme", id).Call(dctx, "1", tool, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					out, _ := e.c.fn(ctx, inv)
					die()
					return out, ctx.Err()
				}, nil)
				require.Error(t, err)
				e.b.clock.Advance(rt2Lapse)
				task := e.g.Task("acme", id)
				e.px.Arm(faultproxy.CutAfter, n, true)
				res1, err1 := task.Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
				fired, at := e.px.Disarm()
				if fired {
					e.px.Settle(t, e.b.pool)
				}
				label := fmt.Sprintf("take-over cut after round trip %d (%.80q)", n, at)
				t.Logf("%s: heard %v; starts %d", label, err1, e.c.Starts(ref))
				require.False(t, rt3Raw(err1) && !errors.Is(err1, ledger.ErrOutcomeUnknown), "%s: raw database error %v", label, err1)
				var outs []string
				if err1 == nil {
					outs = append(outs, string(res1.Output))
				}
				for _, lapse := range []bool{false, true} {
					if lapse {
						e.b.clock.Advance(rt2Lapse)
					}
					for _, tk := range []*agent.Task{task, e.g.Task("acme", id), e.other.Task("acme", id)} {
						res, err := tk.Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
						switch {
						case err == nil:
							outs = append(outs, string(res.Output))
						case errors.Is(err, agent.ErrUncertain) && !tool.AcceptsKey:
						case errors.Is(err, ledger.ErrInProgress) && !lapse:
						default:
							t.Errorf("%s: a retry (lapse %v) heard %v", label, lapse, err)
						}
					}
				}
				invs := e.c.Invs(ref)
				if !tool.AcceptsKey {
					require.Len(t, invs, 1, "%s: a tool without a key that acted once", label)
					require.Empty(t, outs, label)
				} else {
					require.LessOrEqual(t, len(invs), 2, label)
					for _, inv := range invs[1:] {
						require.True(t, inv.Redrive, "%s: a start after an attempt that acted", label)
						require.Equal(t, invs[0].DownstreamKey, inv.DownstreamKey, label)
					}
					require.NotEmpty(t, outs, label)
				}
				for _, o := range outs {
					require.JSONEq(t, outs[0], o, label)
				}
				if !fired {
					break
				}
			}
		})
	}
}

// After the owner's last act on a task (a refused call with changed arguments, a call
// frozen for approval, a replay, a definitive failure, a heartbeat), Task.LeaseUntil
// says when the claim runs out: another agent is refused the task a second before it
// and takes it over a second after.
func TestRedteam3LeaseUntilTellsTheTruth(t *testing.T) {
	t.Parallel()
	for _, last := range []string{"changed", "pending", "replay", "definitive", "heartbeat"} {
		t.Run(last, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			a, err := e.g.ClaimTask(ctx, "acme", "until", &agent.ClaimTaskOpts{Lease: 20 * time.Second})
			require.NoError(t, err)
			_, err = a.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
			require.NoError(t, err)
			e.b.clock.Advance(15 * time.Second)
			switch last {
			case "changed":
				_, err = a.Call(ctx, "1", smtpSend, rt3ArgsB, e.c.fn, nil)
				require.ErrorIs(t, err, agent.ErrArgumentsChanged)
			case "pending":
				_, err = a.Call(ctx, "2", rt3Refund, rt2Args, e.c.fn, nil)
				require.ErrorIs(t, err, agent.ErrApprovalPending)
			case "replay":
				res, err := a.Call(ctx, "1", smtpSend, rt2Args, e.c.fn, nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
			case "definitive":
				_, err = a.Call(ctx, "3", emailAPI, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					e.c.start(inv)
					return nil, ledger.Definitive("declined", "no")
				}, nil)
				require.Error(t, err)
			case "heartbeat":
				require.NoError(t, a.Heartbeat(ctx))
			}
			until := a.LeaseUntil()
			t.Logf("after %s, %v from now", last, until.Sub(e.b.clock.Now()))
			require.True(t, until.After(e.b.clock.Now()), "the claim is live")
			e.b.clock.Advance(until.Sub(e.b.clock.Now()) - time.Second)
			_, err = e.other.ClaimTask(ctx, "acme", "until", nil)
			require.ErrorIs(t, err, ledger.ErrInProgress, "a second before LeaseUntil")
			e.b.clock.Advance(2 * time.Second)
			b, err := e.other.ClaimTask(ctx, "acme", "until", nil)
			require.NoError(t, err, "a second after LeaseUntil")
			require.True(t, b.TakenOver)
			e.stale(t, a, "after "+last)
		})
	}
}

// LeaseUntil after the owner's calls that are refused: one in progress (no wait), one
// uncertain, one rejected, a database call with changed arguments. Another agent is
// refused the task a second before LeaseUntil and takes it over a second after.
func TestRedteam3LeaseUntilAfterRefusals(t *testing.T) {
	t.Parallel()
	for _, last := range []string{"inprogress", "uncertain", "rejected", "changedTx"} {
		t.Run(last, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Minute)
			a, err := e.g.ClaimTask(ctx, "acme", "refusals", &agent.ClaimTaskOpts{Lease: 20 * time.Second})
			require.NoError(t, err)
			release := make(chan struct{})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			held := make(chan struct{})
			done := make(chan error, 1)
			switch last {
			case "inprogress":
				go func() {
					_, err := a.Call(ctx, "5", emailAPI, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
						close(held)
						<-release
						return e.c.fn(ctx, inv)
					}, nil)
					done <- err
				}()
				<-held
			case "uncertain":
				dctx, die := context.WithCancel(ctx)
				_, err := a.Call(dctx, "6", smtpSend, rt2Args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					e.c.start(inv)
					die()
					return nil, ctx.Err()
				}, nil)
				require.ErrorIs(t, err, agent.ErrUncertain)
				e.b.clock.Advance(18 * time.Second)
				require.NoError(t, a.Heartbeat(ctx))
			case "rejected":
				_, err := a.Call(ctx, "7", rt3Refund, rt2Args, e.c.fn, nil)
				require.ErrorIs(t, err, agent.ErrApprovalPending)
				w, err := e.g.Waiting(ctx, "acme", 10)
				require.NoError(t, err)
				require.Len(t, w, 1)
				require.NoError(t, e.g.Reject(ctx, w[0], "ops", "no"))
			case "changedTx":
				_, err := a.CallTx(ctx, "8", ticket, rt2Args, e.c.local, nil)
				require.NoError(t, err)
			}
			e.b.clock.Advance(15 * time.Second)
			switch last {
			case "inprogress":
				_, err = a.Call(ctx, "5", emailAPI, rt2Args, e.c.fn, nil)
				require.ErrorIs(t, err, ledger.ErrInProgress)
			case "uncertain":
				_, err = a.Call(ctx, "6", smtpSend, rt2Args, e.c.fn, nil)
				require.ErrorIs(t, err, agent.ErrUncertain)
			case "rejected":
				_, err = a.Call(ctx, "7", rt3Refund, rt2Args, e.c.fn, nil)
				require.ErrorIs(t, err, agent.ErrRejected)
			case "changedTx":
				_, err = a.CallTx(ctx, "8", ticket, rt3ArgsB, e.c.local, nil)
				require.ErrorIs(t, err, agent.ErrArgumentsChanged)
			}
			until := a.LeaseUntil()
			t.Logf("after %s, %v from now", last, until.Sub(e.b.clock.Now()))
			require.True(t, until.After(e.b.clock.Now()), "the claim is live")
			e.b.clock.Advance(until.Sub(e.b.clock.Now()) - time.Second)
			_, err = e.other.ClaimTask(ctx, "acme", "refusals", nil)
			require.ErrorIs(t, err, ledger.ErrInProgress, "a second before LeaseUntil")
			e.b.clock.Advance(2 * time.Second)
			b, err := e.other.ClaimTask(ctx, "acme", "refusals", nil)
			require.NoError(t, err, "a second after LeaseUntil")
			require.True(t, b.TakenOver)
			if last == "inprogress" {
				releaseOnce.Do(func() { close(release) })
				<-done
			}
		})
	}
}

// 24 goroutines of the owner finish its task at once, half with one outcome and half
// with another, while the owner's calls race them. Finish is
// idempotent for its owner: every Finish with the committed outcome hears nil, every one
// with the other hears the task done; nobody hears a database error; another agent is
// refused the finished task.
func TestRedteam3ConcurrentFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := rt3Setup(t, time.Minute)
	for round := 0; round < 4; round++ {
		id := "finish-" + strconv.Itoa(round)
		a, err := e.g.ClaimTask(ctx, "acme", id, nil)
		require.NoError(t, err)
		outcomes := []json.RawMessage{json.RawMessage(`{"done":"x"}`), json.RawMessage(`{"done":"y"}`)}
		const n = 24
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				if i%4 == 3 {
					_, errs[i] = a.Call(ctx, "c"+strconv.Itoa(i), smtpSend, rt2Args, e.c.fn, nil)
					return
				}
				errs[i] = a.Finish(ctx, outcomes[i%2])
			}(i)
		}
		close(start)
		wg.Wait()
		won := -1
		for i, err := range errs {
			if i%4 == 3 {
				ref := e.ref(t, id, "c"+strconv.Itoa(i), smtpSend)
				switch {
				case err == nil:
					require.Equal(t, 1, e.c.Starts(ref))
				case errors.Is(err, agent.ErrTaskDone), errors.Is(err, agent.ErrStaleOwner):
					require.Zero(t, e.c.Starts(ref), "round %d: a refused call started its tool", round)
				default:
					t.Errorf("round %d: call %d heard %v", round, i, err)
				}
				continue
			}
			if err == nil {
				if won >= 0 && won != i%2 {
					t.Errorf("round %d: Finish with both outcomes heard nil", round)
				}
				won = i % 2
			}
		}
		require.GreaterOrEqual(t, won, 0, "round %d: no Finish heard nil: %v", round, errs)
		for i, err := range errs {
			if i%4 == 3 || err == nil {
				continue
			}
			if rt3Raw(err) || !errors.Is(err, agent.ErrTaskDone) || i%2 == won {
				t.Errorf("round %d: Finish %d (outcome %s, committed %s) heard %v", round, i, outcomes[i%2], outcomes[won], err)
			}
		}
		_, err = e.other.ClaimTask(ctx, "acme", id, nil)
		require.ErrorIs(t, err, agent.ErrTaskDone)
		require.NoError(t, a.Finish(ctx, outcomes[won]), "a retry with the committed outcome")
	}
}

// A claim's answer is lost; the same process resumes it, and its tool outlives the
// resumed claim's lease while another process takes the call over. The resumed attempt
// hears an *agent.UncertainError that wraps the lease-lost error, and the record is the
// other attempt's: made again with the same key, or reported uncertain.
func TestRedteam3ResumedClaimOutlivesLease(t *testing.T) {
	t.Parallel()
	for _, tool := range []agent.Tool{smtpSend, emailAPI} {
		t.Run(tool.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := rt3Setup(t, time.Hour)
			task := e.g.Task("acme", "resumed-slow")
			ref := e.ref(t, "resumed-slow", "1", tool)
			e.loseClaim(t, task, "1", tool, rt2Args)
			var resB agent.Result
			var errB error
			fn := func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				n := e.c.start(inv)
				if n == 1 {
					e.b.clock.Advance(rt2Lapse)
					resB, errB = e.other.Task("acme", "resumed-slow").Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
				}
				return rt3Output(inv, n), nil
			}
			_, errA := task.Call(ctx, "1", tool, rt2Args, fn, nil)
			t.Logf("the other process heard %v; the resumed attempt heard %v", errB, errA)
			invs := e.c.Invs(ref)
			require.False(t, invs[0].Redrive)
			if tool.AcceptsKey {
				require.NoError(t, errB)
				require.Len(t, invs, 2)
				require.True(t, invs[1].Redrive)
				require.Equal(t, invs[0].DownstreamKey, invs[1].DownstreamKey)
			} else {
				require.ErrorIs(t, errB, agent.ErrUncertain)
				require.Len(t, invs, 1)
			}
			var unc *agent.UncertainError
			require.ErrorAs(t, errA, &unc)
			require.ErrorIs(t, errA, ledger.ErrLeaseLost)
			res, err := task.Call(ctx, "1", tool, rt2Args, e.c.fn, nil)
			if tool.AcceptsKey {
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.JSONEq(t, string(resB.Output), string(res.Output))
			} else {
				require.ErrorIs(t, err, agent.ErrUncertain)
			}
			require.Equal(t, len(invs), e.c.Starts(ref))
		})
	}
}

package testsuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultpoint"
)

// ToolCase describes an agent's tool to check with [CheckAgentTool].
type ToolCase struct {
	// Guard is the guard the tool runs under. Its ledger must follow the database's
	// clock (no stubbed NowFunc): a crashed attempt's lease runs out by it.
	Guard *agent.Guard
	// Tool is the tool's description.
	Tool agent.Tool
	// Func is the tool, for a tool that acts outside the database; Local is the tool
	// for one that writes only through the call's transaction. Set one.
	Func  agent.ToolFunc
	Local agent.LocalFunc
	// Args are the arguments the check calls the tool with. Defaults to {}.
	Args json.RawMessage
	// ChangedArgs are the arguments of a retry whose model changed its mind. Defaults
	// to Args with a member "oncekit_changed" added.
	ChangedArgs json.RawMessage
	// Tenant is the tenant of the check's tasks. Defaults to [TenantPrefix].
	Tenant string
	// Effects counts the effects of one call where they land (on the provider's side
	// for an external tool), such as "SELECT count(*) FROM emails WHERE idempotency_key
	// = $1" with the invocation's DownstreamKey, or a count by the call's task.
	Effects func(ctx context.Context, call agent.CallRef) (int, error)
}

// ToolFault is a fault the agent tool check injects.
type ToolFault string

// The faults of [CheckAgentTool].
const (
	// ToolCrashAfterEffect: the tool acted and the agent died before the outcome was
	// recorded (for a local tool: before its transaction committed).
	ToolCrashAfterEffect ToolFault = "crash-after-effect"
	// ToolLostAnswer: the tool acted and its answer was lost on the way back.
	ToolLostAnswer ToolFault = "lost-answer"
	// ToolChangedArguments: the call succeeded and a retry came with other arguments.
	ToolChangedArguments ToolFault = "changed-arguments"
)

// ToolReport is what the agent tool check observed for one fault.
type ToolReport struct {
	Fault ToolFault
	// Effects is how many effects the call had, retries included.
	Effects int
	// Uncertain is true when the retry reported the call uncertain, as it must for a
	// tool that takes no key after a crash or a lost answer.
	Uncertain bool
	// Err is the retry's error, when it is not the one the fault calls for.
	Err error
	// Replayed is true when the retry's output came from the ledger.
	Replayed bool
}

// Problem returns nil when the tool behaved as the fault calls for, and otherwise an
// error that says what went wrong.
func (r ToolReport) Problem(tool agent.Tool) error {
	switch {
	case r.Err != nil:
		return fmt.Errorf("after %s: %w", r.Fault, r.Err)
	case r.Effects > 1 && tool.AcceptsKey:
		return fmt.Errorf("after %s: the effect happened %d times: the tool was made again with the same downstream key and its provider "+
			"acted again; send agent.Invocation.DownstreamKey as the provider's idempotency key", r.Fault, r.Effects)
	case r.Effects != 1:
		return fmt.Errorf("after %s: the effect happened %d times, want exactly 1", r.Fault, r.Effects)
	case r.Uncertain && tool.AcceptsKey:
		return fmt.Errorf("after %s: a tool that accepts a key was reported uncertain", r.Fault)
	}
	return nil
}

// RunAgentTool runs c's tool under each fault, each in a task of its own, and reports
// what happened.
func RunAgentTool(c ToolCase) ([]ToolReport, error) {
	if c.Guard == nil || c.Effects == nil || (c.Func == nil) == (c.Local == nil) {
		return nil, errors.New("oncekit/testsuite: a ToolCase needs a Guard, Effects, and one of Func and Local")
	}
	if len(c.Args) == 0 {
		c.Args = json.RawMessage("{}")
	}
	if len(c.ChangedArgs) == 0 {
		var m map[string]any
		if err := json.Unmarshal(c.Args, &m); err != nil || m == nil {
			return nil, errors.New("oncekit/testsuite: Args is not a JSON object: set ChangedArgs")
		}
		m["oncekit_changed"] = true
		c.ChangedArgs, _ = json.Marshal(m)
	}
	if c.Tenant == "" {
		c.Tenant = TenantPrefix
	}
	faults := []ToolFault{ToolCrashAfterEffect, ToolLostAnswer, ToolChangedArguments}
	if c.Local != nil {
		faults = []ToolFault{ToolCrashAfterEffect, ToolChangedArguments}
	}
	var reps []ToolReport
	for _, f := range faults {
		rep, err := runToolFault(c, f)
		if err != nil {
			return reps, err
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

func runToolFault(c ToolCase, f ToolFault) (ToolReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	task := c.Guard.Task(c.Tenant, "oncekit-check-"+uuid.NewString())
	const step = "1"
	call := func(ctx context.Context, args json.RawMessage) (agent.Result, error) {
		// The retry waits out the crashed attempt's lease.
		opts := &agent.CallOpts{Wait: 30 * time.Second}
		if c.Local != nil {
			return task.CallTx(ctx, step, c.Tool, args, c.Local, opts)
		}
		return task.Call(ctx, step, c.Tool, args, c.Func, opts)
	}
	rep := ToolReport{Fault: f}
	var fault faultpoint.Fault
	switch f {
	case ToolCrashAfterEffect:
		fault = faultpoint.Crash
	case ToolLostAnswer:
		fault = faultpoint.LoseAnswer
	}
	fctx := faultpoint.With(ctx, func(_ context.Context, p faultpoint.Point, _ any, _ error) faultpoint.Fault {
		if p == faultpoint.AfterCall || p == faultpoint.BeforeCommit {
			return fault
		}
		return faultpoint.None
	})
	first, err := call(fctx, c.Args)
	if fault == faultpoint.None && err != nil {
		return rep, fmt.Errorf("oncekit/testsuite: the tool failed by itself (%w); the check needs a call that succeeds", err)
	}
	var res agent.Result
	switch f {
	case ToolChangedArguments:
		res, err = call(ctx, c.ChangedArgs)
		switch {
		case err == nil:
			rep.Err = errors.New("a retry with other arguments was not refused: it returned the tool's output")
		case !errors.Is(err, agent.ErrArgumentsChanged):
			rep.Err = fmt.Errorf("a retry with other arguments was not refused with agent.ErrArgumentsChanged: %w", err)
		}
	default:
		res, err = call(ctx, c.Args)
		if errors.Is(err, agent.ErrUncertain) {
			rep.Uncertain = true
		} else if err != nil {
			rep.Err = fmt.Errorf("the retry failed: %w", err)
		}
	}
	rep.Replayed = res.Replayed
	if f == ToolChangedArguments && rep.Err == nil {
		again, err := call(ctx, c.Args)
		switch {
		case err != nil:
			rep.Err = fmt.Errorf("a retry with the first arguments failed: %w", err)
		case !again.Replayed || !bytes.Equal(again.Output, first.Output):
			rep.Err = fmt.Errorf("a retry with the first arguments did not replay the stored output (%s, replayed %v)", again.Output, again.Replayed)
		}
	}
	ref, err := c.Guard.Ref(task.Tenant, task.ID, step, c.Tool.Name)
	if err != nil {
		return rep, err
	}
	if rep.Effects, err = c.Effects(ctx, ref); err != nil {
		return rep, fmt.Errorf("oncekit/testsuite: count the effects: %w", err)
	}
	return rep, nil
}

// CheckAgentTool is the crash-point conformance test of an agent's tool: it fails t
// unless the tool, crashed after its effect, with its answer lost, and retried with
// arguments the model changed, has its effect exactly once; a retry after a crash or a
// lost answer either replays or re-drives with the same downstream key (a tool that
// accepts a key) or is reported uncertain (one that does not), and a retry with other
// arguments is refused.
func CheckAgentTool(t testing.TB, c ToolCase) {
	t.Helper()
	reps, err := RunAgentTool(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range reps {
		if err := rep.Problem(c.Tool); err != nil {
			t.Fatalf("oncekit/testsuite: tool %q: %v", c.Tool.Name, err)
		}
	}
}

package testsuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	commonpb "go.temporal.io/api/common/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/ledger"
)

// Case describes an activity to check with [CheckCrashBeforeComplete].
type Case[Req any] struct {
	// Name is the name the activity is registered under (its stable operation name).
	Name string
	// Activity is the activity function: func(context.Context, Req) (Resp, error) for any
	// Resp, or func(context.Context, Req) error.
	Activity any
	// Request is the input the check runs the activity with.
	Request Req
	// Ledger is the ledger the activity records in.
	Ledger *ledger.Ledger
	// Tenant is the activity's tenant. Each crash point runs under its own tenant, so
	// that one point's record is not replayed by the next: Tenant (default
	// [TenantPrefix]) followed by a random suffix.
	Tenant string
	// Effects counts the activity's effect where it lands, such as
	// "SELECT count(*) FROM charges WHERE order_id = $1" through [Count]; for an external
	// activity, count on the provider's side. Optional when Provider is set.
	Effects func(ctx context.Context) (int, error)
	// Provider is the recording provider an external activity under test calls, if it
	// calls one: the check then also fails when a retry called it with another key.
	Provider *Provider
	// Local runs the activity as a local activity. The in-memory environment retries a
	// failed local activity under a new activity ID, so a local activity under test
	// needs a business key (activity.Opts.Key) to be recognised on retry.
	Local bool
}

// Report is what a crash check observed at one crash point.
type Report struct {
	// Point is where the first attempt crashed.
	Point CrashPoint
	// Effects is how many effects the run added: 1 for an exactly-once activity.
	Effects int
	// Crashed is the fault injected into the first attempt.
	Crashed Crash
	// Result is the outcome the workflow received, from the retry; JSON-encoded, as is
	// CrashedResult (what the crashed attempt, or its call, had produced).
	Result        []byte
	CrashedResult []byte
	Err           error
	// Keys are the idempotency keys the Provider received during the run, in order.
	Keys []string
}

// SameResult reports whether the retry returned what the crashed attempt had produced.
func (r Report) SameResult() bool {
	return r.Err == nil && r.Crashed.Err == nil && bytes.Equal(r.Result, r.CrashedResult)
}

// Problem returns nil when the run was exactly once, and otherwise an error that says
// what went wrong: the attempt failed by itself, the retry failed, the effect happened
// other than once, the retry answered differently, or the provider saw a second key.
func (r Report) Problem() error {
	switch {
	case r.Crashed.Err != nil:
		return fmt.Errorf("at %s: the first attempt failed by itself (%w); the check needs an attempt that succeeds", r.Point, r.Crashed.Err)
	case r.Err != nil:
		return fmt.Errorf("at %s: the retry after the crash failed: %w", r.Point, r.Err)
	case len(slices.Compact(slices.Clone(r.Keys))) > 1:
		return fmt.Errorf("at %s: the retry called the provider with another idempotency key (%q): send activity.Call.DownstreamKey", r.Point, r.Keys)
	case r.Effects > 1 && (r.Point == AfterCall || r.Point == LostAnswer):
		return fmt.Errorf("at %s: the effect happened %d times across the crash and the retry, want exactly 1: the retry "+
			"called the provider again and it acted again. Inside activity.External, send the provider call.DownstreamKey as "+
			"its idempotency key (the same on every attempt), not a key of your own", r.Point, r.Effects)
	case r.Effects != 1:
		return fmt.Errorf("at %s: the effect happened %d times across the crash and the retry, want exactly 1", r.Point, r.Effects)
	case r.Point == BeforeEffect || r.Point == BeforeCommit:
		return nil // the crashed attempt produced nothing to compare with
	case !r.SameResult():
		return fmt.Errorf("at %s: the retry returned %s, but the crashed attempt had produced %s", r.Point, r.Result, r.CrashedResult)
	}
	return nil
}

// RunCrashBeforeComplete runs c's activity in a workflow on Temporal's in-memory
// environment, crashes its first attempt at [AfterEffect], lets Temporal retry it, and
// reports what happened.
func RunCrashBeforeComplete[Req any](c Case[Req]) (Report, error) {
	reps, err := runCrashPoints(c, []CrashPoint{AfterEffect})
	if err != nil {
		return Report{}, err
	}
	return reps[0], nil
}

// RunCrashPoints runs c's activity once per crash point it reaches: at [AfterEffect] and
// [BeforeEffect], at [BeforeCommit] for an activity built on activity.Do, and at
// [AfterCall] and [LostAnswer] for one built on activity.External.
// Each run crashes the first attempt at its point and lets Temporal retry.
func RunCrashPoints[Req any](c Case[Req]) ([]Report, error) {
	return runCrashPoints(c, CrashPoints)
}

func runCrashPoints[Req any](c Case[Req], points []CrashPoint) ([]Report, error) {
	if c.Name == "" || c.Activity == nil || (c.Effects == nil && c.Provider == nil) {
		return nil, errors.New("oncekit/testsuite: Case needs Name, Activity, and Effects or Provider")
	}
	if err := checkActivity[Req](c.Activity); err != nil {
		return nil, err
	}
	var reps []Report
	for i, point := range points {
		rep, reached, err := runPoint(c, point)
		if err != nil {
			return nil, err
		}
		if !reached {
			if i == 0 {
				return nil, fmt.Errorf("oncekit/testsuite: %s never reached %s", c.Name, point)
			}
			continue // not an activity of that kind: the point does not apply
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

func runPoint[Req any](c Case[Req], point CrashPoint) (Report, bool, error) {
	ctx := context.Background()
	rep := Report{Point: point}
	before, err := c.count(ctx)
	if err != nil {
		return rep, false, fmt.Errorf("oncekit/testsuite: count effects before: %w", err)
	}
	firstKey := c.Provider.mark()
	tenant := c.Tenant
	if tenant == "" {
		tenant = TenantPrefix
	}
	plan := NewFaultPlan().CrashAt(c.Name, point, 1)
	env := NewWorkflowEnvironment(&EnvConfig{Ledger: c.Ledger, Tenant: tenant + "-" + uuid.NewString()[:8], Faults: plan})
	env.RegisterActivityWithOptions(c.Activity, tactivity.RegisterOptions{Name: c.Name})
	env.RegisterWorkflowWithOptions(conformanceWorkflow[Req], workflow.RegisterOptions{Name: "oncekit.testsuite.Conformance"})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "oncekit-conformance-" + string(point)})
	env.ExecuteWorkflow("oncekit.testsuite.Conformance", c.Name, c.Local, c.Request)
	if !env.IsWorkflowCompleted() {
		return rep, false, errors.New("oncekit/testsuite: the conformance workflow did not complete")
	}
	if !plan.Reached(c.Name, point) {
		return rep, false, nil
	}
	if rep.Err = env.GetWorkflowError(); rep.Err == nil {
		var out json.RawMessage
		if err := env.GetWorkflowResult(&out); err != nil {
			return rep, false, err
		}
		rep.Result = compactJSON(out)
	}
	crashes := plan.Injected()
	if len(crashes) != 1 {
		return rep, false, fmt.Errorf("oncekit/testsuite: expected one injected crash of %q at %s, got %d", c.Name, point, len(crashes))
	}
	rep.Crashed = crashes[0]
	if rep.Crashed.Err == nil && !errorOnly(c.Activity) {
		crashed := rep.Crashed.Result
		// A local activity's interceptor sees its result already encoded.
		if p, ok := crashed.(*commonpb.Payloads); ok {
			var decoded json.RawMessage
			if err := converter.GetDefaultDataConverter().FromPayloads(p, &decoded); err != nil {
				return rep, false, fmt.Errorf("oncekit/testsuite: decode the crashed attempt's result: %w", err)
			}
			crashed = decoded
		}
		if crashed != nil {
			b, err := json.Marshal(crashed)
			if err != nil {
				return rep, false, fmt.Errorf("oncekit/testsuite: encode the crashed attempt's result: %w", err)
			}
			rep.CrashedResult = compactJSON(b)
		}
	}
	after, err := c.count(ctx)
	if err != nil {
		return rep, false, fmt.Errorf("oncekit/testsuite: count effects after: %w", err)
	}
	rep.Effects = after - before
	rep.Keys = c.Provider.keysSince(firstKey)
	return rep, true, nil
}

// count counts effects with Effects, or else on the Provider.
func (c Case[Req]) count(ctx context.Context) (int, error) {
	if c.Effects != nil {
		return c.Effects(ctx)
	}
	return c.Provider.Effects(), nil
}

func compactJSON(b []byte) []byte {
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// errorOnly reports whether fn returns only an error, so it has no result to compare.
func errorOnly(fn any) bool { return reflect.TypeOf(fn).NumOut() == 1 }

// checkActivity refuses an Activity that is not an activity function taking Req.
func checkActivity[Req any](fn any) error {
	t := reflect.TypeOf(fn)
	ctxType := reflect.TypeFor[context.Context]()
	errType := reflect.TypeFor[error]()
	ok := t != nil && t.Kind() == reflect.Func && t.NumIn() == 2 && t.In(0) == ctxType &&
		t.In(1) == reflect.TypeFor[Req]() && t.NumOut() >= 1 && t.NumOut() <= 2 && t.Out(t.NumOut()-1) == errType
	if !ok {
		return fmt.Errorf("oncekit/testsuite: Case.Activity is %v; want func(context.Context, %v) (Resp, error) or func(context.Context, %v) error",
			t, reflect.TypeFor[Req](), reflect.TypeFor[Req]())
	}
	return nil
}

// CheckCrashBeforeComplete is the exactly-once test of an activity: it fails t unless
// the activity, crashed at every crash point it reaches and retried, has its effect
// exactly once and gives the retry the same result the crashed attempt (or its call)
// produced. For an activity built on activity.External the points include the crash
// after the provider acted and before the ledger recorded it, which only the downstream
// key survives.
func CheckCrashBeforeComplete[Req any](t testing.TB, c Case[Req]) {
	t.Helper()
	reps, err := RunCrashPoints(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range reps {
		if err := rep.Problem(); err != nil {
			t.Fatalf("oncekit/testsuite: %s: %v", c.Name, err)
		}
	}
}

func conformanceWorkflow[Req any](ctx workflow.Context, name string, local bool, req Req) (json.RawMessage, error) {
	var out json.RawMessage
	retry := &temporal.RetryPolicy{InitialInterval: time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 5}
	if local {
		ctx = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: retry})
		err := workflow.ExecuteLocalActivity(ctx, name, req).Get(ctx, &out)
		return out, err
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: retry})
	err := workflow.ExecuteActivity(ctx, name, req).Get(ctx, &out)
	return out, err
}

// Provider stands in for an external API that honours idempotency keys, for testing
// activities built on activity.External: the first call with a key acts and answers with
// a new ID; a later call with the same key acts no more and answers the same ID. It
// records every key it receives. Safe for concurrent use.
type Provider struct {
	mu   sync.Mutex
	ids  map[string]string
	keys []string
}

// NewProvider returns a provider that has not acted yet.
func NewProvider() *Provider { return &Provider{ids: map[string]string{}} }

// Call acts once per idempotency key and returns the ID of the act, and whether this
// call acted (false: it replayed an earlier act with the same key).
func (p *Provider) Call(idempotencyKey string) (id string, acted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = append(p.keys, idempotencyKey)
	if id, ok := p.ids[idempotencyKey]; ok {
		return id, false
	}
	id = fmt.Sprintf("act_%d", len(p.ids)+1)
	p.ids[idempotencyKey] = id
	return id, true
}

// Effects returns how many times the provider acted: once per distinct key.
func (p *Provider) Effects() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

// Keys returns every key the provider received, in order.
func (p *Provider) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys)
}

func (p *Provider) mark() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys)
}

func (p *Provider) keysSince(i int) []string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys[i:])
}

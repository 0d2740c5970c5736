package testsuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/ledger"
)

// Case describes an activity to check with [CheckCrashBeforeComplete].
type Case[Req, Resp any] struct {
	// Name is the name the activity is registered under (its stable operation name).
	Name string
	// Activity is the activity function.
	Activity func(ctx context.Context, req Req) (Resp, error)
	// Request is the input the check runs the activity with.
	Request Req
	// Ledger is the ledger the activity records in.
	Ledger *ledger.Ledger
	// Tenant is the activity's tenant. Defaults to a fresh tenant per run, see
	// [TenantDefault].
	Tenant string
	// Effects counts the activity's effect where it lands, such as
	// "SELECT count(*) FROM charges WHERE order_id = $1" through [Count].
	Effects func(ctx context.Context) (int, error)
	// Local runs the activity as a local activity. The in-memory environment retries a
	// failed local activity under a new activity ID, so a local activity under test
	// needs a business key (activity.Opts.Key) to be recognised on retry.
	Local bool
}

// Report is what [RunCrashBeforeComplete] observed.
type Report struct {
	// Effects is how many effects the run added: 1 for an exactly-once activity.
	Effects int
	// Crashed is the outcome of the attempt whose completion was lost.
	Crashed Crash
	// Result is the outcome the workflow received, from the retry; JSON-encoded, as is
	// CrashedResult.
	Result        []byte
	CrashedResult []byte
	Err           error
}

// SameResult reports whether the retry returned what the crashed attempt had produced.
func (r Report) SameResult() bool {
	return r.Err == nil && r.Crashed.Err == nil && bytes.Equal(r.Result, r.CrashedResult)
}

// RunCrashBeforeComplete runs c's activity in a workflow on Temporal's in-memory
// environment, crashes its first attempt after the effect and before completion, lets
// Temporal retry it, and reports what happened.
func RunCrashBeforeComplete[Req, Resp any](c Case[Req, Resp]) (Report, error) {
	if c.Name == "" || c.Activity == nil || c.Effects == nil {
		return Report{}, errors.New("oncekit/testsuite: Case needs Name, Activity and Effects")
	}
	ctx := context.Background()
	before, err := c.Effects(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("oncekit/testsuite: count effects before: %w", err)
	}
	plan := NewFaultPlan().CrashAfterEffect(c.Name, 1)
	env := NewWorkflowEnvironment(&EnvOpts{Ledger: c.Ledger, Tenant: c.Tenant, Faults: plan})
	env.RegisterActivity(c.Name, c.Activity)
	env.RegisterWorkflow("oncekit.testsuite.Conformance", conformanceWorkflow[Req, Resp])
	env.ExecuteWorkflow("oncekit.testsuite.Conformance", c.Name, c.Local, c.Request)
	if !env.IsWorkflowCompleted() {
		return Report{}, errors.New("oncekit/testsuite: the conformance workflow did not complete")
	}
	var rep Report
	var out Resp
	if rep.Err = env.GetWorkflowError(); rep.Err == nil {
		if err := env.GetWorkflowResult(&out); err != nil {
			return Report{}, err
		}
		rep.Result, _ = json.Marshal(out)
	}
	crashes := plan.Injected()
	if len(crashes) != 1 {
		return Report{}, fmt.Errorf("oncekit/testsuite: expected one injected crash of %q, got %d", c.Name, len(crashes))
	}
	rep.Crashed = crashes[0]
	if rep.Crashed.Err == nil {
		crashed := rep.Crashed.Result
		// A local activity's interceptor sees its result already encoded.
		if p, ok := crashed.(*commonpb.Payloads); ok {
			var decoded Resp
			if err := converter.GetDefaultDataConverter().FromPayloads(p, &decoded); err != nil {
				return Report{}, fmt.Errorf("oncekit/testsuite: decode the crashed attempt's result: %w", err)
			}
			crashed = decoded
		}
		rep.CrashedResult, _ = json.Marshal(crashed)
	}
	after, err := c.Effects(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("oncekit/testsuite: count effects after: %w", err)
	}
	rep.Effects = after - before
	return rep, nil
}

// CheckCrashBeforeComplete is the exactly-once test of an activity: it fails t unless
// the activity, crashed after its effect and retried, has its effect exactly once and
// gives the retry the same result the crashed attempt produced.
func CheckCrashBeforeComplete[Req, Resp any](t testing.TB, c Case[Req, Resp]) {
	t.Helper()
	rep, err := RunCrashBeforeComplete(c)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Crashed.Err != nil {
		t.Fatalf("oncekit/testsuite: %s: the first attempt failed by itself (%v); the check needs an attempt that succeeds", c.Name, rep.Crashed.Err)
	}
	if rep.Err != nil {
		t.Fatalf("oncekit/testsuite: %s: the retry after the crash failed: %v", c.Name, rep.Err)
	}
	if rep.Effects != 1 {
		t.Fatalf("oncekit/testsuite: %s: the effect happened %d times across the crash and the retry, want exactly 1", c.Name, rep.Effects)
	}
	if !rep.SameResult() {
		t.Fatalf("oncekit/testsuite: %s: the retry returned %s, but the crashed attempt had produced %s", c.Name, rep.Result, rep.CrashedResult)
	}
}

func conformanceWorkflow[Req, Resp any](ctx workflow.Context, name string, local bool, req Req) (Resp, error) {
	var out Resp
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

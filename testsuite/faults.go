package testsuite

import (
	"context"
	"sync"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
)

// ErrTypeWorkerCrashed is the ApplicationError type of an injected crash. It is
// retryable, so Temporal retries the activity as it would after a lost worker.
const ErrTypeWorkerCrashed = "oncekit.testsuite.WorkerCrashed"

// FaultPlan says which activity attempts crash after their side effect. It is safe for
// concurrent use.
type FaultPlan struct {
	mu       sync.Mutex
	crashes  map[string]map[int32]bool
	injected []Crash
}

// Crash records an injected crash: the attempt ran, and its outcome never reached
// Temporal.
type Crash struct {
	ActivityType string
	Attempt      int32
	// Result and Err are what the attempt returned before the crash discarded them.
	Result any
	Err    error
}

// NewFaultPlan returns an empty plan.
func NewFaultPlan() *FaultPlan {
	return &FaultPlan{crashes: map[string]map[int32]bool{}}
}

// CrashAfterEffect makes the listed attempts (attempt 1 when none is listed) of the
// activity registered as activityType run to completion, effect and all, and then fail
// as if the worker died before reporting: the completion never arrives and Temporal
// retries.
func (p *FaultPlan) CrashAfterEffect(activityType string, attempts ...int32) *FaultPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(attempts) == 0 {
		attempts = []int32{1}
	}
	if p.crashes[activityType] == nil {
		p.crashes[activityType] = map[int32]bool{}
	}
	for _, a := range attempts {
		p.crashes[activityType][a] = true
	}
	return p
}

// Injected returns the crashes injected so far, in order.
func (p *FaultPlan) Injected() []Crash {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Crash(nil), p.injected...)
}

func (p *FaultPlan) crash(activityType string, attempt int32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.crashes[activityType][attempt]
}

// Interceptor returns the worker interceptor that carries out the plan. Install it on
// any worker, in memory or real.
func (p *FaultPlan) Interceptor() interceptor.WorkerInterceptor { return &faultInterceptor{plan: p} }

type faultInterceptor struct {
	interceptor.WorkerInterceptorBase
	plan *FaultPlan
}

func (f *faultInterceptor) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &faultActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, plan: f.plan}
}

type faultActivity struct {
	interceptor.ActivityInboundInterceptorBase
	plan *FaultPlan
}

func (a *faultActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	res, err := a.Next.ExecuteActivity(ctx, in)
	info := tactivity.GetInfo(ctx)
	if !a.plan.crash(info.ActivityType.Name, info.Attempt) {
		return res, err
	}
	a.plan.mu.Lock()
	a.plan.injected = append(a.plan.injected, Crash{ActivityType: info.ActivityType.Name, Attempt: info.Attempt, Result: res, Err: err})
	a.plan.mu.Unlock()
	return nil, temporal.NewApplicationError("oncekit/testsuite: injected crash after the activity's effect, before its completion was reported", ErrTypeWorkerCrashed)
}

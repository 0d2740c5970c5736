package testsuite

import (
	"context"
	"errors"
	"sync"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/policy"
)

// CrashPoint is where an injected fault strikes an activity attempt.
type CrashPoint string

// The crash points. Every activity reaches BeforeEffect and AfterEffect; an activity
// built on activity.Do also reaches BeforeCommit; one built on activity.External also
// reaches AfterCall and LostAnswer, once per call.
const (
	// BeforeEffect: the worker died as the attempt started, before anything happened.
	BeforeEffect CrashPoint = "before-effect"
	// BeforeCommit: the activity's writes are done and the worker died before the
	// ledger's transaction committed them; PostgreSQL rolls them back.
	BeforeCommit CrashPoint = "before-commit"
	// AfterEffect: the activity ran to completion, effect and all, and its worker died
	// before reporting: the completion never reaches Temporal, which retries.
	AfterEffect CrashPoint = "after-effect"
	// AfterCall: the external call returned (the provider acted) and the worker died
	// before the ledger recorded the outcome; the attempt's lease runs out, and the retry
	// takes the key over and calls again. Only the same downstream key keeps the provider
	// from acting twice.
	AfterCall CrashPoint = "after-call"
	// LostAnswer: the provider acted but its answer was lost on the way back (a reset
	// connection): the call returns an error, and the retry calls again.
	LostAnswer CrashPoint = "lost-answer"
)

// CrashPoints lists every crash point, in the order [CheckCrashBeforeComplete] tries them.
var CrashPoints = []CrashPoint{AfterEffect, AfterCall, LostAnswer, BeforeEffect, BeforeCommit}

// FaultPlan says which activity attempts crash, and where. It is safe for concurrent use.
type FaultPlan struct {
	mu       sync.Mutex
	crashes  map[string]map[CrashPoint]map[int32]bool
	reached  map[string]map[CrashPoint]bool
	injected []Crash
}

// Crash records an injected fault: the attempt ran up to its crash point, and its
// outcome never reached Temporal (or, at LostAnswer, reached it as an error).
type Crash struct {
	ActivityType string
	Attempt      int32
	Point        CrashPoint
	// Result and Err are what the attempt (at AfterEffect) or its external call (at
	// AfterCall and LostAnswer) returned before the fault discarded them.
	Result any
	Err    error
}

// NewFaultPlan returns an empty plan.
func NewFaultPlan() *FaultPlan {
	return &FaultPlan{crashes: map[string]map[CrashPoint]map[int32]bool{}, reached: map[string]map[CrashPoint]bool{}}
}

// CrashAfterEffect makes the listed attempts (attempt 1 when none is listed) of the
// activity registered as activityType crash at [AfterEffect].
func (p *FaultPlan) CrashAfterEffect(activityType string, attempts ...int32) *FaultPlan {
	return p.CrashAt(activityType, AfterEffect, attempts...)
}

// CrashAt makes the listed attempts (attempt 1 when none is listed) of the activity
// registered as activityType crash at point.
func (p *FaultPlan) CrashAt(activityType string, point CrashPoint, attempts ...int32) *FaultPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(attempts) == 0 {
		attempts = []int32{1}
	}
	if p.crashes[activityType] == nil {
		p.crashes[activityType] = map[CrashPoint]map[int32]bool{}
	}
	if p.crashes[activityType][point] == nil {
		p.crashes[activityType][point] = map[int32]bool{}
	}
	for _, a := range attempts {
		p.crashes[activityType][point][a] = true
	}
	return p
}

// Injected returns the crashes injected so far, in order.
func (p *FaultPlan) Injected() []Crash {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Crash(nil), p.injected...)
}

// Reached reports whether an attempt of the activity registered as activityType reached
// point, crash or not.
func (p *FaultPlan) Reached(activityType string, point CrashPoint) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reached[activityType][point]
}

// strike records that point was reached and reports whether a crash is planned there,
// recording it as injected if so.
func (p *FaultPlan) strike(activityType string, attempt int32, point CrashPoint, result any, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reached[activityType] == nil {
		p.reached[activityType] = map[CrashPoint]bool{}
	}
	p.reached[activityType][point] = true
	if !p.crashes[activityType][point][attempt] {
		return false
	}
	p.injected = append(p.injected, Crash{ActivityType: activityType, Attempt: attempt, Point: point, Result: result, Err: err})
	return true
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
	info := tactivity.GetInfo(ctx)
	typ, attempt := info.ActivityType.Name, info.Attempt
	if a.plan.strike(typ, attempt, BeforeEffect, nil, nil) {
		return nil, temporal.NewApplicationError("oncekit/testsuite: injected crash: the attempt's worker died as it started", policy.ErrTypeWorkerCrashed)
	}
	ctx = faultpoint.With(ctx, func(_ context.Context, point faultpoint.Point, result any, err error) faultpoint.Fault {
		switch {
		case point == faultpoint.BeforeCommit:
			if a.plan.strike(typ, attempt, BeforeCommit, nil, nil) {
				return faultpoint.Crash
			}
		case a.plan.strike(typ, attempt, AfterCall, result, err):
			return faultpoint.Crash
		case a.plan.strike(typ, attempt, LostAnswer, result, err):
			return faultpoint.LoseAnswer
		}
		return faultpoint.None
	})
	res, err := a.Next.ExecuteActivity(ctx, in)
	if errors.Is(err, faultpoint.ErrCrashed) || a.plan.strike(typ, attempt, AfterEffect, res, err) {
		return nil, temporal.NewApplicationError("oncekit/testsuite: injected crash: the attempt's worker died before its completion was reported", policy.ErrTypeWorkerCrashed)
	}
	return res, err
}

// Package faultpoint lets a test's fault plan strike inside oncekit's guards, at points
// that an interceptor around the whole activity cannot reach: after an external call
// returned and before the ledger recorded its outcome.
package faultpoint

import (
	"context"
	"errors"
)

// Point is a place inside a guard where a fault can be injected.
type Point string

// The points.
const (
	// AfterCall: activity.External's call returned and its outcome is not recorded yet.
	AfterCall Point = "after-call"
	// BeforeCommit: the ledger's Do ran fn, whose writes are done and not committed.
	BeforeCommit Point = "before-commit"
)

// Fault is what the hook decides at a point.
type Fault int

// The faults.
const (
	// None: carry on.
	None Fault = iota
	// Crash: the attempt dies here; nothing after the point happens, and the attempt's
	// lease runs out as it would by the deadline of a lost attempt.
	Crash
	// LoseAnswer: the call acted but its answer is lost: the guard sees an error instead
	// of the call's result.
	LoseAnswer
)

// Hook decides the fault at point, given what the call returned.
type Hook func(ctx context.Context, point Point, result any, err error) Fault

type hookKey struct{}

// With returns a copy of ctx carrying h.
func With(ctx context.Context, h Hook) context.Context { return context.WithValue(ctx, hookKey{}, h) }

// At asks the hook carried by ctx, if any, which fault strikes at point.
func At(ctx context.Context, point Point, result any, err error) Fault {
	h, _ := ctx.Value(hookKey{}).(Hook)
	if h == nil {
		return None
	}
	return h(ctx, point, result, err)
}

// ErrCrashed is returned by a guard whose attempt an injected crash ended.
var ErrCrashed = errors.New("oncekit: injected crash: the attempt died before it recorded its outcome")

// ErrLostAnswer stands in for the answer an injected fault lost.
var ErrLostAnswer = errors.New("oncekit: injected fault: the call acted but its answer was lost (connection reset)")

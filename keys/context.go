package keys

import "context"

// contextKey is the type of the context keys this package defines.
type contextKey struct{ name string }

func (k *contextKey) String() string { return "oncekit/keys context value " + k.name }

// Context keys under which oncekit carries a tenant and a key, in Go contexts and in
// Temporal workflow contexts alike. Workflow code sets them with workflow.WithValue:
//
//	ctx = workflow.WithValue(ctx, keys.TenantContextKey, "acme")
var (
	// TenantContextKey carries the tenant (a string). oncekit's context propagator (see
	// package worker) carries it from a client to its workflows, and from workflows to
	// their activities and child workflows.
	TenantContextKey = &contextKey{"tenant"}
	// KeyContextKey carries a [Key] that workflow code hands one activity call; the
	// propagator carries it to that activity only, never to a child workflow. Package
	// saga keys its steps and compensations this way.
	KeyContextKey = &contextKey{"key"}
	// StepContextKey carries the [Step] that a saga compensation undoes; the propagator
	// carries it to that activity only. Package saga sets it, and package activity reads
	// the step's stored result through it.
	StepContextKey = &contextKey{"step"}
)

// Step names the saga step a compensation undoes.
type Step struct {
	// Key is the step's key.
	Key Key `json:"key"`
	// Operation is the name the step's activity ran under, its operation. Package saga
	// sets the name Temporal gives the step's activity (its string, or its function's
	// name), and oncekit's worker interceptor corrects it to the name the step actually
	// ran under; it is empty when neither knew it.
	Operation string `json:"operation,omitempty"`
}

// WithStep returns a copy of ctx carrying s, as a compensation's context carries the
// step it undoes.
func WithStep(ctx context.Context, s Step) context.Context {
	return context.WithValue(ctx, StepContextKey, s)
}

// StepFrom returns the step carried by ctx, a Go or a workflow context.
func StepFrom(ctx Valuer) (Step, bool) {
	s, ok := ctx.Value(StepContextKey).(Step)
	return s, ok && s.Key != ""
}

// Valuer is what both context.Context and Temporal's workflow.Context offer.
type Valuer interface {
	Value(key any) any
}

// WithTenant returns a copy of ctx that carries tenant. A client that starts workflows
// with such a context, through oncekit's context propagator, hands the tenant to the
// workflow and to every activity it runs.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, TenantContextKey, tenant)
}

// TenantFrom returns the tenant carried by ctx, a Go or a workflow context.
func TenantFrom(ctx Valuer) (string, bool) {
	t, ok := ctx.Value(TenantContextKey).(string)
	return t, ok && t != ""
}

// WithKey returns a copy of ctx carrying k, as an activity's context carries the key its
// workflow handed it.
func WithKey(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, KeyContextKey, k)
}

// KeyFrom returns the key carried by ctx, a Go or a workflow context.
func KeyFrom(ctx Valuer) (Key, bool) {
	k, ok := ctx.Value(KeyContextKey).(Key)
	return k, ok && k != ""
}

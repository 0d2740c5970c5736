package keys

import (
	"context"

	"go.temporal.io/sdk/workflow"
)

// tenantKey is the context key of the tenant, in both Go and workflow contexts.
type tenantKey struct{}

// WithTenant returns a copy of ctx that carries tenant. A client that starts workflows
// with such a context, through oncekit's context propagator (see package worker), hands
// the tenant to the workflow and to every activity it runs.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant carried by ctx.
func TenantFrom(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(tenantKey{}).(string)
	return t, ok && t != ""
}

// WithWorkflowTenant is [WithTenant] for workflow code.
func WithWorkflowTenant(ctx workflow.Context, tenant string) workflow.Context {
	return workflow.WithValue(ctx, tenantKey{}, tenant)
}

// WorkflowTenant is [TenantFrom] for workflow code.
func WorkflowTenant(ctx workflow.Context) (string, bool) {
	t, ok := ctx.Value(tenantKey{}).(string)
	return t, ok && t != ""
}

// intentKey is the context key of a key handed to one activity call.
type intentKey struct{}

// WithWorkflowKey returns a workflow context that hands k to the activities executed with
// it: through oncekit's context propagator the activity finds k with [KeyFrom], and
// package activity uses it as the activity's key. Package saga keys its steps and
// compensations this way. The key reaches activities only, never child workflows.
func WithWorkflowKey(ctx workflow.Context, k Key) workflow.Context {
	return workflow.WithValue(ctx, intentKey{}, k)
}

// WorkflowKey returns the key set with [WithWorkflowKey].
func WorkflowKey(ctx workflow.Context) (Key, bool) {
	k, ok := ctx.Value(intentKey{}).(Key)
	return k, ok && k != ""
}

// WithKey returns a copy of ctx carrying k, as an activity's context carries the key
// its workflow handed it.
func WithKey(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, intentKey{}, k)
}

// KeyFrom returns the key carried by ctx.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(intentKey{}).(Key)
	return k, ok && k != ""
}

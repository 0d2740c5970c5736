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

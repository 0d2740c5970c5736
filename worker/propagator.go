package worker

import (
	"context"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
)

// TenantHeader is the Temporal header that carries the tenant.
const TenantHeader = "oncekit-tenant"

// TenantPropagator returns the context propagator that carries the tenant of
// [keys.WithTenant] from a client to its workflows, and from workflows to their
// activities and child workflows. [Dial] installs it.
func TenantPropagator() workflow.ContextPropagator { return tenantPropagator{} }

type tenantPropagator struct{}

func (tenantPropagator) Inject(ctx context.Context, w workflow.HeaderWriter) error {
	if t, ok := keys.TenantFrom(ctx); ok {
		return writeTenant(w, t)
	}
	return nil
}

func (tenantPropagator) InjectFromWorkflow(ctx workflow.Context, w workflow.HeaderWriter) error {
	if t, ok := keys.WorkflowTenant(ctx); ok {
		return writeTenant(w, t)
	}
	return nil
}

func (tenantPropagator) Extract(ctx context.Context, r workflow.HeaderReader) (context.Context, error) {
	t, err := readTenant(r)
	if err != nil || t == "" {
		return ctx, err
	}
	return keys.WithTenant(ctx, t), nil
}

func (tenantPropagator) ExtractToWorkflow(ctx workflow.Context, r workflow.HeaderReader) (workflow.Context, error) {
	t, err := readTenant(r)
	if err != nil || t == "" {
		return ctx, err
	}
	return keys.WithWorkflowTenant(ctx, t), nil
}

func writeTenant(w workflow.HeaderWriter, tenant string) error {
	p, err := converter.GetDefaultDataConverter().ToPayload(tenant)
	if err != nil {
		return err
	}
	w.Set(TenantHeader, p)
	return nil
}

func readTenant(r workflow.HeaderReader) (string, error) {
	p, ok := r.Get(TenantHeader)
	if !ok {
		return "", nil
	}
	var t string
	err := converter.GetDefaultDataConverter().FromPayload(p, &t)
	return t, err
}

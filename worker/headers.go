package worker

import (
	"context"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
)

// Temporal headers that oncekit's interceptors write and read; nothing else writes them.
const (
	// TenantHeader carries the tenant: from a client to the workflows it starts, and from
	// workflows to their activities and child workflows.
	TenantHeader = "oncekit-tenant"
	// KeyHeader carries a key that workflow code handed one activity call (a saga
	// step's), to that activity only.
	KeyHeader = "oncekit-key"
	// StepHeader carries the saga step that a compensation undoes, to the compensation.
	StepHeader = "oncekit-step"
)

// ClientInterceptor returns the client interceptor that writes the tenant of
// [keys.WithTenant], from the context a workflow is started (or signalled with start,
// or updated with start) with, into the workflow's header, where [Interceptor] reads it.
// [NewPlugin] installs it on the client it is given to; a client built without the
// plugin can list it in client.Options.Interceptors.
func ClientInterceptor() interceptor.ClientInterceptor { return &clientInterceptor{} }

type clientInterceptor struct {
	interceptor.ClientInterceptorBase
}

func (*clientInterceptor) InterceptClient(next interceptor.ClientOutboundInterceptor) interceptor.ClientOutboundInterceptor {
	return &clientOutbound{ClientOutboundInterceptorBase: interceptor.ClientOutboundInterceptorBase{Next: next}}
}

type clientOutbound struct {
	interceptor.ClientOutboundInterceptorBase
}

func (c *clientOutbound) ExecuteWorkflow(ctx context.Context, in *interceptor.ClientExecuteWorkflowInput) (client.WorkflowRun, error) {
	if err := injectTenant(ctx); err != nil {
		return nil, err
	}
	return c.Next.ExecuteWorkflow(ctx, in)
}

func (c *clientOutbound) SignalWithStartWorkflow(ctx context.Context, in *interceptor.ClientSignalWithStartWorkflowInput) (client.WorkflowRun, error) {
	if err := injectTenant(ctx); err != nil {
		return nil, err
	}
	return c.Next.SignalWithStartWorkflow(ctx, in)
}

func (c *clientOutbound) UpdateWithStartWorkflow(ctx context.Context, in *interceptor.ClientUpdateWithStartWorkflowInput) (client.WorkflowUpdateHandle, error) {
	if err := injectTenant(ctx); err != nil {
		return nil, err
	}
	return c.Next.UpdateWithStartWorkflow(ctx, in)
}

// injectTenant writes ctx's tenant into the header of the workflow call ctx is for.
func injectTenant(ctx context.Context) error {
	t, ok := keys.TenantFrom(ctx)
	h := interceptor.Header(ctx)
	if !ok || h == nil {
		return nil
	}
	return writeHeader(mapHeader(h), TenantHeader, t)
}

// injectFromWorkflow writes the tenant, a key handed to one activity call and a
// compensation's step from workflow code into the header of the call ctx is for.
func injectFromWorkflow(ctx workflow.Context, w workflow.HeaderWriter) error {
	if t, ok := keys.TenantFrom(ctx); ok {
		if err := writeHeader(w, TenantHeader, t); err != nil {
			return err
		}
	}
	if k, ok := keys.KeyFrom(ctx); ok {
		if err := writeHeader(w, KeyHeader, string(k)); err != nil {
			return err
		}
	}
	if s, ok := keys.StepFrom(ctx); ok {
		return writeHeader(w, StepHeader, s)
	}
	return nil
}

// extractToActivity reads the tenant, the key and the step into an activity's context.
func extractToActivity(ctx context.Context, r workflow.HeaderReader) (context.Context, error) {
	t, err := readHeader(r, TenantHeader)
	if err != nil {
		return ctx, err
	}
	if t != "" {
		ctx = keys.WithTenant(ctx, t)
	}
	k, err := readHeader(r, KeyHeader)
	if err != nil {
		return ctx, err
	}
	if k != "" {
		ctx = keys.WithKey(ctx, keys.Key(k))
	}
	var s keys.Step
	if _, err := readHeaderInto(r, StepHeader, &s); err != nil {
		return ctx, err
	}
	if s.Key != "" {
		ctx = keys.WithStep(ctx, s)
	}
	return ctx, nil
}

// extractToWorkflow reads the tenant alone into a workflow's context, so that a key
// meant for one activity never spreads to a child workflow's activities.
func extractToWorkflow(ctx workflow.Context, r workflow.HeaderReader) (workflow.Context, error) {
	t, err := readHeader(r, TenantHeader)
	if err != nil || t == "" {
		return ctx, err
	}
	return workflow.WithValue(ctx, keys.TenantContextKey, t), nil
}

func writeHeader(w workflow.HeaderWriter, name string, value any) error {
	p, err := converter.GetDefaultDataConverter().ToPayload(value)
	if err != nil {
		return err
	}
	w.Set(name, p)
	return nil
}

func readHeader(r workflow.HeaderReader, name string) (string, error) {
	var v string
	_, err := readHeaderInto(r, name, &v)
	return v, err
}

func readHeaderInto(r workflow.HeaderReader, name string, v any) (bool, error) {
	p, ok := r.Get(name)
	if !ok {
		return false, nil
	}
	return true, converter.GetDefaultDataConverter().FromPayload(p, v)
}

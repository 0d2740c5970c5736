package worker

import (
	"context"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
)

// Temporal headers that oncekit's propagator uses.
const (
	// TenantHeader carries the tenant.
	TenantHeader = "oncekit-tenant"
	// KeyHeader carries a key that workflow code handed one activity call.
	KeyHeader = "oncekit-key"
	// StepHeader carries the saga step that a compensation undoes.
	StepHeader = "oncekit-step"
)

// TenantPropagator returns oncekit's context propagator. It carries the tenant of
// [keys.WithTenant] from a client to its workflows, and from workflows to their
// activities and child workflows; and it carries a key set under [keys.KeyContextKey]
// to the activity executed with it (never to a child workflow). [NewPlugin] adds it to
// the client's context propagators; a client built without the plugin can list it in
// client.Options.ContextPropagators.
func TenantPropagator() workflow.ContextPropagator { return propagator{} }

type propagator struct{}

func (propagator) Inject(ctx context.Context, w workflow.HeaderWriter) error {
	if t, ok := keys.TenantFrom(ctx); ok {
		return writeHeader(w, TenantHeader, t)
	}
	return nil
}

func (propagator) InjectFromWorkflow(ctx workflow.Context, w workflow.HeaderWriter) error {
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

// Extract runs for activities: both the tenant and the key apply.
func (propagator) Extract(ctx context.Context, r workflow.HeaderReader) (context.Context, error) {
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

// ExtractToWorkflow runs for workflows: only the tenant applies, so a key meant for one
// activity never spreads to a child workflow's activities.
func (propagator) ExtractToWorkflow(ctx workflow.Context, r workflow.HeaderReader) (workflow.Context, error) {
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

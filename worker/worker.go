package worker

import (
	"context"
	"errors"

	commonpb "go.temporal.io/api/common/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// PluginName is the name the plugin reports to Temporal.
const PluginName = "oncekit"

// TenantDefault is the tenant of activities whose workflow carried none, unless the
// plugin's Config says otherwise. A single-tenant system never needs another.
const TenantDefault = "default"

// Config configures the plugin. Ledger is required; the zero value of every other field
// is its default.
type Config struct {
	// Ledger is put in every activity's context, where package activity finds it.
	// Required: [NewPlugin] returns an error without it.
	Ledger *ledger.Ledger
	// DefaultTenant is the tenant of activities whose workflow carried none, such as
	// workflows started without keys.WithTenant. Defaults to [TenantDefault]. It is not
	// checked here: a tenant that keys.Scope refuses fails each guarded activity with a
	// non-retryable ApplicationError of type policy.ErrTypeInvalid.
	DefaultTenant string
	// RequireTenant makes activities whose workflow carried no tenant fail with a
	// non-retryable ApplicationError of type policy.ErrTypeInvalid that says so, instead
	// of running under DefaultTenant, which it ignores: for multi-tenant systems, where a
	// missing tenant is a bug. Defaults to false.
	RequireTenant bool
}

// NewPlugin returns oncekit's Temporal plugin, or an error when cfg.Ledger is nil. Put it
// in client.Options.Plugins, and every worker created from that client gets it too (or
// put it in a worker's Options.Plugins alone). It adds [ClientInterceptor] to the client,
// which carries the tenant to the workflows it starts, and, on each worker, the
// interceptor that hands activities the ledger and their tenant and makes
// activity.Definitive non-retryable in every activity ([Interceptor]), and the
// activities package saga records outcomes with
// (activity.RegisterSaga).
func NewPlugin(cfg Config) (*temporal.SimplePlugin, error) {
	if cfg.Ledger == nil {
		return nil, errors.New("oncekit/worker: Config.Ledger is required")
	}
	tenant := cfg.DefaultTenant
	switch {
	case cfg.RequireTenant:
		tenant = ""
	case tenant == "":
		tenant = TenantDefault
	}
	return temporal.NewSimplePlugin(temporal.SimplePluginOptions{
		Name:               PluginName,
		ClientInterceptors: []interceptor.ClientInterceptor{ClientInterceptor()},
		WorkerInterceptors: []interceptor.WorkerInterceptor{Interceptor(cfg.Ledger, tenant)},
		RunContextBefore: func(_ context.Context, o temporal.SimplePluginRunContextBeforeOptions) error {
			if !o.WorkflowReplayer {
				activity.RegisterSaga(o.Registry)
			}
			return nil
		},
	})
}

// Interceptor returns the worker interceptor that puts l, the activity's
// [ledger.Origin] (its workflow ID, run ID, workflow type and activity type, which
// every record it writes carries), and defaultTenant when the activity carries no
// tenant, into every activity's context; an empty defaultTenant
// leaves such activities without one. It turns an activity.Definitive failure returned
// by any activity into the non-retryable ApplicationError typed by its code that
// activity.Do returns. It also carries the tenant, a step's key and a
// compensation's step from workflow code to activities in their headers. [NewPlugin]
// installs it; use it alone on a worker built without the plugin, together with
// activity.RegisterSaga.
func Interceptor(l *ledger.Ledger, defaultTenant string) interceptor.WorkerInterceptor {
	return &workerInterceptor{l: l, tenant: defaultTenant}
}

type workerInterceptor struct {
	interceptor.WorkerInterceptorBase
	l      *ledger.Ledger
	tenant string
}

func (wi *workerInterceptor) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &activityInterceptor{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, wi: wi}
}

type activityInterceptor struct {
	interceptor.ActivityInboundInterceptorBase
	wi *workerInterceptor
}

func (a *activityInterceptor) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	// The headers written by the workflow interceptor below, for clients without
	// oncekit's propagator.
	if h := interceptor.Header(ctx); h != nil {
		var err error
		if ctx, err = extractToActivity(ctx, mapHeader(h)); err != nil {
			return nil, err
		}
	}
	ctx = activity.WithLedger(ctx, a.wi.l)
	if _, ok := ledger.OriginFrom(ctx); !ok {
		// Every record the activity writes says where it came from, so an operator finds
		// it from the workflow ID whatever its key is made of.
		info := tactivity.GetInfo(ctx)
		o := ledger.Origin{WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID, ActivityType: info.ActivityType.Name}
		if info.WorkflowType != nil { // nil for an activity no workflow started
			o.WorkflowType = info.WorkflowType.Name
		}
		ctx = ledger.WithOrigin(ctx, o)
	}
	if _, ok := keys.TenantFrom(ctx); !ok && a.wi.tenant != "" {
		ctx = keys.WithTenant(ctx, a.wi.tenant)
	}
	res, err := a.Next.ExecuteActivity(ctx, in)
	return res, definitive(err)
}

// definitive makes a [ledger.DefinitiveError] (activity.Definitive) returned by any
// activity, one that did not go through activity.Do or External included, the
// non-retryable ApplicationError typed by its code that activity.Do makes of it, so
// that a definitive failure is not retried on one path and final on another. An error
// that already is an ApplicationError is the activity's own choice and passes as it is.
func definitive(err error) error {
	var (
		app  *temporal.ApplicationError
		derr *ledger.DefinitiveError
	)
	if err == nil || errors.As(err, &app) || !errors.As(err, &derr) {
		return err
	}
	return temporal.NewApplicationErrorWithOptions(err.Error(), derr.Code, temporal.ApplicationErrorOptions{
		NonRetryable: true, Details: []any{derr.Code, derr.Message, derr.Replayed}})
}

// The interceptor carries the tenant, key and step from workflow code to activities
// and child workflows in their headers: the one path they travel.
func (wi *workerInterceptor) InterceptWorkflow(ctx workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &workflowInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}}
}

type workflowInbound struct {
	interceptor.WorkflowInboundInterceptorBase
}

func (w *workflowInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	return w.Next.Init(&workflowOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: outbound},
		stepOps: map[keys.Key]string{}})
}

func (w *workflowInbound) ExecuteWorkflow(ctx workflow.Context, in *interceptor.ExecuteWorkflowInput) (any, error) {
	if _, ok := keys.TenantFrom(ctx); !ok {
		if h := interceptor.WorkflowHeader(ctx); h != nil {
			var err error
			if ctx, err = extractToWorkflow(ctx, mapHeader(h)); err != nil {
				return nil, err
			}
		}
	}
	return w.Next.ExecuteWorkflow(ctx, in)
}

type workflowOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	// stepOps maps the key of each activity run with a key (a saga's step) to the name it
	// ran under, so that the compensation that undoes it names the step's operation even
	// when the step named its activity by function. One workflow execution owns it, and
	// replaying the workflow rebuilds it in the same order.
	stepOps map[keys.Key]string
}

func inject(ctx workflow.Context) {
	if h := interceptor.WorkflowHeader(ctx); h != nil {
		// Encoding a string or a keys.Step cannot fail.
		_ = injectFromWorkflow(ctx, mapHeader(h))
	}
}

func (w *workflowOutbound) ExecuteActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	if step, ok := keys.StepFrom(ctx); ok {
		if op, ran := w.stepOps[step.Key]; ran && op != step.Operation {
			step.Operation = op
			ctx = workflow.WithValue(ctx, keys.StepContextKey, step)
		}
	} else if k, ok := keys.KeyFrom(ctx); ok {
		w.stepOps[k] = activityType
	}
	inject(ctx)
	return w.Next.ExecuteActivity(ctx, activityType, args...)
}

// NewContinueAsNewError carries the tenant, alone, to the workflow's next run.
func (w *workflowOutbound) NewContinueAsNewError(ctx workflow.Context, wfn any, args ...any) error {
	injectTenantToNextRun(ctx)
	return w.Next.NewContinueAsNewError(ctx, wfn, args...)
}

// NewContinueAsNewErrorWithOptions is NewContinueAsNewError with options.
func (w *workflowOutbound) NewContinueAsNewErrorWithOptions(ctx workflow.Context, opts workflow.ContinueAsNewErrorOptions, wfn any, args ...any) error {
	injectTenantToNextRun(ctx)
	return w.Next.NewContinueAsNewErrorWithOptions(ctx, opts, wfn, args...)
}

func injectTenantToNextRun(ctx workflow.Context) {
	t, ok := keys.TenantFrom(ctx)
	if h := interceptor.WorkflowHeader(ctx); h != nil && ok {
		_ = writeHeader(mapHeader(h), TenantHeader, t) // encoding a string cannot fail
	}
}

func (w *workflowOutbound) ExecuteLocalActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	inject(ctx)
	return w.Next.ExecuteLocalActivity(ctx, activityType, args...)
}

func (w *workflowOutbound) ExecuteChildWorkflow(ctx workflow.Context, childWorkflowType string, args ...any) workflow.ChildWorkflowFuture {
	inject(ctx)
	return w.Next.ExecuteChildWorkflow(ctx, childWorkflowType, args...)
}

// mapHeader is a Temporal header map seen as a header reader and writer.
type mapHeader map[string]*commonpb.Payload

func (m mapHeader) Set(key string, value *commonpb.Payload) { m[key] = value }

func (m mapHeader) Get(key string) (*commonpb.Payload, bool) {
	v, ok := m[key]
	return v, ok
}

func (m mapHeader) ForEachKey(handler func(string, *commonpb.Payload) error) error {
	for k, v := range m {
		if err := handler(k, v); err != nil {
			return err
		}
	}
	return nil
}

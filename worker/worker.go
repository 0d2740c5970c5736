package worker

import (
	"context"
	"errors"

	commonpb "go.temporal.io/api/common/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Options configure a [Worker]. A nil *Options means all defaults.
type Options struct {
	// Worker are Temporal's worker options; oncekit's interceptor is appended to
	// Worker.Interceptors. Defaults to Temporal's defaults.
	Worker tworker.Options
	// DefaultTenant is the tenant of activities whose workflow carried none, such as
	// workflows started by a plain Temporal client. Defaults to [TenantDefault].
	DefaultTenant string
	// RequireTenant makes activities whose workflow carried no tenant fail with a
	// non-retryable error that says so, instead of running under DefaultTenant: for
	// multi-tenant systems, where a missing tenant is a bug. Defaults to false.
	RequireTenant bool
}

// TenantDefault is the tenant of activities whose workflow carried none, unless the
// worker's options say otherwise. A single-tenant system never needs another.
const TenantDefault = "default"

// Worker is a Temporal worker with oncekit wired in.
type Worker struct {
	w tworker.Worker
}

// New returns a worker polling taskQueue through c, whose activities find l and their
// tenant in their context, with the activities of package saga registered.
func New(c client.Client, taskQueue string, l *ledger.Ledger, opts *Options) (*Worker, error) {
	if c == nil || l == nil {
		return nil, errors.New("oncekit/worker: New needs a client and a ledger")
	}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	tenant := o.DefaultTenant
	switch {
	case o.RequireTenant:
		tenant = ""
	case tenant == "":
		tenant = TenantDefault
	}
	wo := o.Worker
	wo.Interceptors = append(append([]interceptor.WorkerInterceptor{}, wo.Interceptors...), Interceptor(l, tenant))
	w := tworker.New(c, taskQueue, wo)
	activity.RegisterSaga(w)
	return &Worker{w: w}, nil
}

// RegisterActivity registers fn under name. The name scopes the activity's keys (it is
// the default operation), so keep it stable.
func (w *Worker) RegisterActivity(name string, fn any) {
	w.w.RegisterActivityWithOptions(fn, tactivity.RegisterOptions{Name: name})
}

// RegisterWorkflow registers fn under name.
func (w *Worker) RegisterWorkflow(name string, fn any) {
	w.w.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name})
}

// Start starts the worker without blocking.
func (w *Worker) Start() error { return w.w.Start() }

// Stop stops the worker.
func (w *Worker) Stop() { w.w.Stop() }

// Run runs the worker until interruptCh delivers, see [InterruptCh].
func (w *Worker) Run(interruptCh <-chan any) error { return w.w.Run(interruptCh) }

// Temporal returns the underlying Temporal worker.
func (w *Worker) Temporal() tworker.Worker { return w.w }

// InterruptCh returns a channel that delivers on SIGINT and SIGTERM.
func InterruptCh() <-chan any { return tworker.InterruptCh() }

// Dial connects a Temporal client with oncekit's tenant propagator added to opts.
func Dial(ctx context.Context, opts client.Options) (client.Client, error) {
	opts.ContextPropagators = append(append([]workflow.ContextPropagator{}, opts.ContextPropagators...), TenantPropagator())
	return client.DialContext(ctx, opts)
}

// Interceptor returns the worker interceptor that puts l, and defaultTenant when the
// activity carries no tenant, into every activity's context; an empty defaultTenant
// leaves such activities without one. [New] installs it; use it directly when building
// a Temporal worker by hand, together with activity.RegisterSaga.
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
		if ctx, err = (propagator{}).Extract(ctx, mapHeader(h)); err != nil {
			return nil, err
		}
	}
	ctx = activity.WithLedger(ctx, a.wi.l)
	if _, ok := keys.TenantFrom(ctx); !ok && a.wi.tenant != "" {
		ctx = keys.WithTenant(ctx, a.wi.tenant)
	}
	return a.Next.ExecuteActivity(ctx, in)
}

// The interceptor also carries the tenant, key and step from workflow code to
// activities itself, so that they arrive when the client was dialled without oncekit's
// propagator: a plain client.Dial is enough.
func (wi *workerInterceptor) InterceptWorkflow(ctx workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &workflowInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}}
}

type workflowInbound struct {
	interceptor.WorkflowInboundInterceptorBase
}

func (w *workflowInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	return w.Next.Init(&workflowOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: outbound}})
}

func (w *workflowInbound) ExecuteWorkflow(ctx workflow.Context, in *interceptor.ExecuteWorkflowInput) (any, error) {
	if _, ok := keys.TenantFrom(ctx); !ok {
		if h := interceptor.WorkflowHeader(ctx); h != nil {
			var err error
			if ctx, err = (propagator{}).ExtractToWorkflow(ctx, mapHeader(h)); err != nil {
				return nil, err
			}
		}
	}
	return w.Next.ExecuteWorkflow(ctx, in)
}

type workflowOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
}

func inject(ctx workflow.Context) {
	if h := interceptor.WorkflowHeader(ctx); h != nil {
		// Encoding a string or a keys.Step cannot fail; the propagator, when installed,
		// writes the same values again.
		_ = (propagator{}).InjectFromWorkflow(ctx, mapHeader(h))
	}
}

func (w *workflowOutbound) ExecuteActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	inject(ctx)
	return w.Next.ExecuteActivity(ctx, activityType, args...)
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

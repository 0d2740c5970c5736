package saga

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
)

// CompensatePurpose is the purpose a compensation's key is derived from its step's key
// with.
const CompensatePurpose = "compensate"

// CompensationOptionsDefault are the activity options of compensations: a minute per
// attempt, retried with backoff for at most ten attempts, after which the saga reports
// the compensation as failed.
func CompensationOptionsDefault() workflow.ActivityOptions {
	retry := policy.RetryPolicy()
	retry.MaximumAttempts = 10
	return workflow.ActivityOptions{StartToCloseTimeout: time.Minute, RetryPolicy: retry}
}

// Options configure a [Saga]. A nil *Options means all defaults.
type Options struct {
	// Key is the saga's key; its steps' keys derive from it. Use the business intent,
	// such as keys.Business("order", orderID), so that a second workflow for the same
	// order replays the first one's steps. Defaults to a key from the workflow ID, which
	// is stable across resets and continue-as-new of one workflow.
	Key keys.Key
	// Parallel runs the compensations all at once instead of in reverse order.
	// Defaults to false.
	Parallel bool
	// CompensationOptions are the compensations' activity options. Defaults to
	// [CompensationOptionsDefault].
	CompensationOptions *workflow.ActivityOptions
}

// Step is one step of a saga.
type Step struct {
	// Name names the step within the saga, such as "charge". With the saga's key it makes
	// the step's key, so keep it stable. Letters, digits, '-', '_' and '.'.
	Name string
	// Activity is the forward activity: a registered name or an activity function.
	Activity any
	// Args are the forward activity's arguments.
	Args []any
	// Compensation undoes the step: a registered name or an activity function. It must
	// tolerate a step that never took effect. Nil for a step with nothing to undo.
	Compensation any
	// CompensationArgs are the compensation's arguments. Defaults to Args.
	CompensationArgs []any
}

// Saga runs steps and compensates them. Create one per workflow run with [New].
type Saga struct {
	key         keys.Key
	opts        Options
	comps       []compensation
	compensated *CompensationError
}

type compensation struct {
	step string
	key  keys.Key
	act  any
	args []any
}

// New returns a saga for the workflow running under ctx.
func New(ctx workflow.Context, opts *Options) (*Saga, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	key := o.Key
	if key == "" {
		var err error
		if key, err = keys.Business("saga", workflow.GetInfo(ctx).WorkflowExecution.ID); err != nil {
			return nil, err
		}
	}
	if err := key.Validate(); err != nil {
		return nil, err
	}
	if o.CompensationOptions == nil {
		co := CompensationOptionsDefault()
		o.CompensationOptions = &co
	}
	return &Saga{key: key, opts: o}, nil
}

// Key returns the saga's key.
func (s *Saga) Key() keys.Key { return s.key }

// StepKey returns the key of the step named name.
func (s *Saga) StepKey(name string) (keys.Key, error) { return keys.Derive(s.key, name) }

// Do registers the step's compensation, then runs its activity with the step's key and
// decodes the activity's result into result (which may be nil). ctx carries the forward
// activity's options.
func (s *Saga) Do(ctx workflow.Context, step Step, result any) error {
	if s.compensated != nil {
		return errors.New("oncekit/saga: the saga has been compensated; start a new saga for new steps")
	}
	stepKey, err := s.StepKey(step.Name)
	if err != nil {
		return fmt.Errorf("oncekit/saga: step %q: %w", step.Name, err)
	}
	if step.Compensation != nil {
		compKey, err := keys.Derive(stepKey, CompensatePurpose)
		if err != nil {
			return err
		}
		args := step.CompensationArgs
		if args == nil {
			args = step.Args
		}
		// Registered before the step runs: a step with an unknown outcome is compensated too.
		s.comps = append(s.comps, compensation{step: step.Name, key: compKey, act: step.Compensation, args: args})
	}
	f := workflow.ExecuteActivity(workflow.WithValue(ctx, keys.KeyContextKey, stepKey), step.Activity, step.Args...)
	return f.Get(ctx, result)
}

// Compensate runs the registered compensations, in reverse order or in parallel, on a
// context disconnected from ctx's cancellation, and returns a [*CompensationError] that
// wraps cause and lists each compensation's outcome. Calling it again returns the same
// error without running anything.
func (s *Saga) Compensate(ctx workflow.Context, cause error) error {
	if s.compensated != nil {
		return s.compensated
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithActivityOptions(dctx, *s.opts.CompensationOptions)
	outcomes := make([]Outcome, len(s.comps))
	run := func(i int) workflow.Future {
		c := s.comps[i]
		outcomes[i] = Outcome{Step: c.step}
		return workflow.ExecuteActivity(workflow.WithValue(dctx, keys.KeyContextKey, c.key), c.act, c.args...)
	}
	if s.opts.Parallel {
		futures := make([]workflow.Future, len(s.comps))
		for i := len(s.comps) - 1; i >= 0; i-- {
			futures[i] = run(i)
		}
		for i := len(s.comps) - 1; i >= 0; i-- {
			outcomes[i].Err = futures[i].Get(dctx, nil)
		}
	} else {
		for i := len(s.comps) - 1; i >= 0; i-- {
			outcomes[i].Err = run(i).Get(dctx, nil)
		}
	}
	// Report in the order compensations ran: last step first.
	ordered := make([]Outcome, 0, len(outcomes))
	for i := len(outcomes) - 1; i >= 0; i-- {
		ordered = append(ordered, outcomes[i])
	}
	s.compensated = &CompensationError{Cause: cause, Outcomes: ordered}
	return s.compensated
}

// Outcome is how one compensation ended.
type Outcome struct {
	// Step is the name of the compensated step.
	Step string
	// Err is nil when the compensation succeeded.
	Err error
}

// CompensationError reports a compensated saga: the failure that caused it and each
// compensation's outcome. errors.Is and errors.As see the cause and every failed
// compensation.
type CompensationError struct {
	Cause    error
	Outcomes []Outcome
}

// Failed returns the outcomes of the compensations that failed.
func (e *CompensationError) Failed() []Outcome {
	var out []Outcome
	for _, o := range e.Outcomes {
		if o.Err != nil {
			out = append(out, o)
		}
	}
	return out
}

func (e *CompensationError) Error() string {
	var b strings.Builder
	b.WriteString("oncekit/saga: compensated")
	if e.Cause != nil {
		b.WriteString(" after: " + e.Cause.Error())
	}
	for _, o := range e.Outcomes {
		if o.Err != nil {
			fmt.Fprintf(&b, "; compensation of %q FAILED: %v", o.Step, o.Err)
		} else {
			fmt.Fprintf(&b, "; %q compensated", o.Step)
		}
	}
	return b.String()
}

// Unwrap returns the cause and the errors of failed compensations.
func (e *CompensationError) Unwrap() []error {
	errs := []error{e.Cause}
	for _, o := range e.Failed() {
		errs = append(errs, o.Err)
	}
	return errs
}

// ApplicationError returns the error to end the workflow with: a non-retryable
// ApplicationError of type [ErrTypeCompensated] (or [ErrTypeCompensationFailed] when a
// compensation failed) whose message lists every outcome.
func (e *CompensationError) ApplicationError() error {
	typ := ErrTypeCompensated
	if len(e.Failed()) > 0 {
		typ = ErrTypeCompensationFailed
	}
	return temporal.NewNonRetryableApplicationError(e.Error(), typ, e)
}

// Error types a workflow ends with through [CompensationError.ApplicationError].
const (
	// ErrTypeCompensated: a step failed and every compensation succeeded.
	ErrTypeCompensated = "oncekit.saga.Compensated"
	// ErrTypeCompensationFailed: a step failed and at least one compensation failed too;
	// an operator must look.
	ErrTypeCompensationFailed = "oncekit.saga.CompensationFailed"
)

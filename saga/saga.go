package saga

import (
	"errors"
	"fmt"
	"slices"
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

// StepOptionsDefault are the activity options of a step whose context carries none: a
// minute per attempt and [policy.StepRetryPolicy], bounded, so that a step that keeps
// failing ends in compensation.
func StepOptionsDefault() workflow.ActivityOptions { return policy.StepOptions(time.Minute) }

// CompensationOptionsDefault are the activity options of compensations: a minute per
// attempt, retried with capped backoff for up to [policy.CompensationDeadlineDefault]
// (24 hours), so a compensation outlives an outage of the database or a provider; only a
// non-retryable error or the deadline ends it, and then the saga reports it as failed.
func CompensationOptionsDefault() workflow.ActivityOptions {
	return policy.CompensationOptions(time.Minute)
}

// LeaseDefault is how long a run owns its saga's key when the workflow has no execution
// timeout: a second run with the same key waits that long for the first to end before
// it takes the saga over.
const LeaseDefault = 24 * time.Hour

// Opts configure a [Saga]. A nil *Opts means all defaults.
type Opts struct {
	// Key is the saga's key: its outcome is recorded under it and its steps' keys derive
	// from it. Use the business intent, such as keys.Business("transfer", transferID), so
	// that a second workflow for the same transfer replays the first one's outcome.
	// Defaults to a key from the workflow ID and the run's original run ID: stable across
	// resets and retries of a workflow task, new for each continue-as-new run and each
	// retry of the whole workflow, so each of those runs its saga afresh.
	Key keys.Key
	// Request is what the saga was started for, such as the transfer. A later run with
	// the same key and a different Request is refused with a non-retryable
	// [policy.ErrTypeKeyReused]. Defaults to nil: the key alone identifies the saga.
	Request any
	// Lease is how long a run owns the saga's key before a second run with the same key
	// may take it over. Defaults to the workflow's execution timeout, or [LeaseDefault].
	Lease time.Duration
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
	// tolerate a step that never took effect (see activity.StepResult). Nil for a step
	// with nothing to undo.
	Compensation any
	// CompensationArgs are the compensation's arguments. Defaults to Args.
	CompensationArgs []any
}

// Saga runs steps and compensates them. [Run] creates one per saga.
type Saga struct {
	key         keys.Key
	opts        Opts
	comps       []compensation
	compensated *CompensationError
	status      Status
}

// QueryStatus is the name of the workflow query [Run] answers with the saga's [Status],
// so that an operator sees a compensation that is still retrying through an outage:
//
//	temporal workflow query --workflow-id ID --type oncekit.saga.status
const QueryStatus = "oncekit.saga.status"

// Status is where a saga stands, as [QueryStatus] answers.
type Status struct {
	Key keys.Key `json:"key"`
	// Phase is "running" (forward steps), "compensating" or "ended".
	Phase string `json:"phase"`
	// Steps are the steps run so far, in order.
	Steps []string `json:"steps,omitempty"`
	// Compensating names the compensation in flight (or, in parallel, the ones not yet
	// finished), and Since says when compensation began: a compensation retrying
	// through an outage shows here for as long as it retries.
	Compensating []string  `json:"compensating,omitempty"`
	Since        time.Time `json:"since,omitzero"`
	// Compensated lists the compensations that finished, each "step: ok" or
	// "step: failed".
	Compensated []string `json:"compensated,omitempty"`
}

type compensation struct {
	step keys.Step
	name string
	key  keys.Key
	act  any
	args []any
}

func newSaga(ctx workflow.Context, opts *Opts) (*Saga, error) {
	o := Opts{}
	if opts != nil {
		o = *opts
	}
	key := o.Key
	if key == "" {
		info := workflow.GetInfo(ctx)
		var err error
		if key, err = keys.Business("saga", info.WorkflowExecution.ID, originalRun(info)); err != nil {
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
	if o.Lease < 0 {
		return nil, errors.New("oncekit/saga: Options.Lease must not be negative")
	}
	if o.Lease == 0 {
		o.Lease = LeaseDefault
		if t := workflow.GetInfo(ctx).WorkflowExecutionTimeout; t > 0 {
			o.Lease = t
		}
	}
	return &Saga{key: key, opts: o}, nil
}

// originalRun is the run ID a reset keeps: the original run's, or this run's when it is
// the original.
func originalRun(info *workflow.Info) string {
	if info.OriginalRunID != "" {
		return info.OriginalRunID
	}
	return info.WorkflowExecution.RunID
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
		ref := keys.Step{Key: stepKey}
		ref.Operation, _ = step.Activity.(string)
		// Registered before the step runs: a step with an unknown outcome is compensated too.
		s.comps = append(s.comps, compensation{step: ref, name: step.Name, key: compKey, act: step.Compensation, args: args})
	}
	s.status.Steps = append(s.status.Steps, step.Name)
	ctx = withStepOptions(ctx)
	f := workflow.ExecuteActivity(workflow.WithValue(ctx, keys.KeyContextKey, stepKey), step.Activity, step.Args...)
	return f.Get(ctx, result)
}

// withStepOptions gives a step the bounded defaults when ctx carries no activity options,
// and the bounded retry policy when its options name none.
func withStepOptions(ctx workflow.Context) workflow.Context {
	o := workflow.GetActivityOptions(ctx)
	switch {
	case o.StartToCloseTimeout == 0 && o.ScheduleToCloseTimeout == 0:
		def := StepOptionsDefault()
		def.TaskQueue = o.TaskQueue
		return workflow.WithActivityOptions(ctx, def)
	case o.RetryPolicy == nil:
		return workflow.WithRetryPolicy(ctx, *policy.StepRetryPolicy())
	}
	return ctx
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
		outcomes[i] = Outcome{Step: c.name}
		cctx := workflow.WithValue(workflow.WithValue(dctx, keys.KeyContextKey, c.key), keys.StepContextKey, c.step)
		return workflow.ExecuteActivity(cctx, c.act, c.args...)
	}
	s.status.Phase, s.status.Since = "compensating", workflow.Now(ctx)
	finished := func(i int) {
		s.status.Compensating = slices.DeleteFunc(s.status.Compensating, func(n string) bool { return n == s.comps[i].name })
		result := "ok"
		if outcomes[i].Err != nil {
			result = "failed"
		}
		s.status.Compensated = append(s.status.Compensated, s.comps[i].name+": "+result)
	}
	if s.opts.Parallel {
		futures := make([]workflow.Future, len(s.comps))
		for i := len(s.comps) - 1; i >= 0; i-- {
			futures[i] = run(i)
			s.status.Compensating = append(s.status.Compensating, s.comps[i].name)
		}
		for i := len(s.comps) - 1; i >= 0; i-- {
			outcomes[i].Err = futures[i].Get(dctx, nil)
			finished(i)
		}
	} else {
		for i := len(s.comps) - 1; i >= 0; i-- {
			s.status.Compensating = []string{s.comps[i].name}
			outcomes[i].Err = run(i).Get(dctx, nil)
			finished(i)
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
	if e.Cause == nil {
		return e.summary()
	}
	return e.summary() + ": " + e.Cause.Error()
}

// summary lists each compensation's outcome, without the cause.
func (e *CompensationError) summary() string {
	var b strings.Builder
	b.WriteString("oncekit/saga: compensated")
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
// ApplicationError of type [policy.ErrTypeCompensated] (or [policy.ErrTypeCompensationFailed] when a
// compensation failed) whose message lists every outcome and whose cause is the failure
// that started the compensation, so each is said once.
func (e *CompensationError) ApplicationError() error {
	return temporal.NewNonRetryableApplicationError(e.summary(), e.errType(), e.Cause)
}

func (e *CompensationError) errType() string {
	if len(e.Failed()) > 0 {
		return policy.ErrTypeCompensationFailed
	}
	return policy.ErrTypeCompensated
}

package saga

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/internal/sagarec"
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
// (Temporal's in-memory test environment stops such retries after 10 attempts.)
func CompensationOptionsDefault() workflow.ActivityOptions {
	return policy.CompensationOptions(time.Minute)
}

// LeaseDefault is the lease of a saga whose workflow has no execution timeout: a run
// that renews nothing for that long is presumed dead, and a second run with the same key
// then takes the saga over.
const LeaseDefault = 24 * time.Hour

// Opts configure a [Saga]. A nil *Opts, or the zero Opts, means all defaults. Options
// no run can use (an invalid Key, a negative Lease, a Request that does not encode as
// JSON) end [Run] at once, before any step, with an error that names the field.
type Opts struct {
	// Key is the saga's key: its outcome is recorded under it and its steps' keys derive
	// from it. Use the business intent, such as the key keys.Business("transfer",
	// transferID) returns, so that a second workflow for the same transfer replays the
	// first one's outcome.
	// Defaults to a key from the workflow ID and the run's original run ID: stable across
	// resets and retries of a workflow task, new for each continue-as-new run and each
	// retry of the whole workflow, so each of those runs its saga afresh. A key that
	// keys.Key.Validate refuses ends Run with a *keys.ValidationError.
	Key keys.Key
	// Request is what the saga was started for, such as the transfer. A later run with
	// the same key and a different Request is refused with a non-retryable
	// [policy.ErrTypeKeyReused]. It is fingerprinted as canonical JSON, so it must
	// encode with encoding/json. Defaults to nil: the key alone identifies the saga.
	Request any
	// Lease is how long a run may go without renewing its claim on the saga's key before
	// a second run with the same key may take the saga over. A live run renews it before
	// each step and compensation and every third of the lease, so a long step or
	// compensation never loses the key; the lease only bounds how long a dead run (its
	// workflow terminated, or no worker running it) keeps others waiting. Keep it above a
	// few seconds. Defaults to the workflow's execution timeout, or [LeaseDefault]; a
	// negative Lease ends Run with an error.
	Lease time.Duration
	// Parallel runs the compensations all at once instead of in reverse order.
	// Defaults to false.
	Parallel bool
	// CompensationOptions are the compensations' activity options, used as they are.
	// Defaults to [CompensationOptionsDefault] (nil): a minute per attempt, retried with
	// capped backoff for up to policy.CompensationDeadlineDefault.
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
	req         sagarec.BeginRequest
	// held is set when the run holds its key through the record activities at each
	// boundary (every run since the saga's commands were versioned).
	held bool
	// ended is the outcome the key holds, once the run finds one it did not record.
	ended *sagarec.Recorded
	// marker is set when the saga began compensating, in this run or an earlier one.
	marker *sagarec.Compensating
	// steps counts the calls of Do, to replay the steps a marker lists.
	steps int
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
		return nil, errors.New("oncekit/saga: Opts.Lease must not be negative: leave it 0 for the default")
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
//
// Before the step runs, Do renews the run's claim on the saga's key. When the key holds
// an outcome already (a reset run of a saga that ended), Do runs nothing and returns an
// error; Run then returns the recorded outcome. When the saga began compensating in an
// earlier run, Do runs only the steps that run had run before the one that failed (they
// replay their records) and returns the recorded failure instead of running the others,
// so the saga compensates as it had begun to.
func (s *Saga) Do(ctx workflow.Context, step Step, result any) error {
	if s.ended != nil {
		return errEnded
	}
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
		// The operation of a step named by function is the name Temporal gives it; the
		// worker's interceptor corrects it to the name the step actually ran under.
		ref := keys.Step{Key: stepKey, Operation: activityName(step.Activity)}
		// Registered before the step runs: a step with an unknown outcome is compensated too.
		s.comps = append(s.comps, compensation{step: ref, name: step.Name, key: compKey, act: step.Compensation, args: args})
	}
	s.status.Steps = append(s.status.Steps, step.Name)
	if s.held {
		i := s.steps
		s.steps++
		if s.marker == nil {
			if err := s.hold(ctx); err != nil {
				return err
			}
			if s.ended != nil {
				return errEnded
			}
		}
		if m := s.marker; m != nil && (i >= len(m.Steps)-1 || m.Steps[i] != step.Name) {
			if err := causeOf(m); err != nil {
				return err
			}
			return errBeganCompensating
		}
	}
	ctx = withStepOptions(ctx)
	f := workflow.ExecuteActivity(workflow.WithValue(ctx, keys.KeyContextKey, stepKey), step.Activity, step.Args...)
	return f.Get(ctx, result)
}

// errEnded is what Do returns once the run found the saga's outcome recorded; Run
// returns that outcome instead.
var errEnded = temporal.NewNonRetryableApplicationError(
	"oncekit/saga: the saga's outcome is already recorded under its key; this run returns it and runs no more steps", policy.ErrTypeInvalid, nil)

// errBeganCompensating is what Do returns in place of a step when an earlier run of the
// saga began compensating without a cause.
var errBeganCompensating = temporal.NewNonRetryableApplicationError(
	"oncekit/saga: an earlier run of the saga began compensating; this run compensates too", policy.ErrTypeInvalid, nil)

// activityName is the name Temporal schedules an activity under when it is named by a
// string or by a function registered under its own name.
func activityName(a any) string {
	if name, ok := a.(string); ok {
		return name
	}
	v := reflect.ValueOf(a)
	if v.Kind() != reflect.Func {
		return ""
	}
	fn := runtime.FuncForPC(v.Pointer())
	if fn == nil {
		return ""
	}
	name := fn.Name()
	return strings.TrimSuffix(name[strings.LastIndex(name, ".")+1:], "-fm")
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
//
// Before the first compensation, Compensate records that the saga is compensating (see
// oncekit.saga.Compensating); if an earlier run of the saga recorded it first, that run's
// cause is the one reported. Before each compensation it renews the run's claim; a run
// that finds the saga's outcome recorded (a reset run) runs no more compensations.
func (s *Saga) Compensate(ctx workflow.Context, cause error) error {
	if s.compensated != nil {
		return s.compensated
	}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	if s.held {
		var err error
		if cause, err = s.beginCompensating(dctx, cause); err != nil {
			// The record cannot be reached for a day: compensate all the same.
			workflow.GetLogger(ctx).Error("oncekit/saga: record that the saga is compensating", "key", string(s.key), "error", err)
		}
		if s.ended != nil {
			s.compensated = &CompensationError{Cause: cause}
			return s.compensated
		}
	}
	dctx = workflow.WithActivityOptions(dctx, *s.opts.CompensationOptions)
	outcomes := make([]Outcome, len(s.comps))
	run := func(i int) workflow.Future {
		c := s.comps[i]
		outcomes[i] = Outcome{Step: c.name}
		cctx := workflow.WithValue(workflow.WithValue(dctx, keys.KeyContextKey, c.key), keys.StepContextKey, c.step)
		return workflow.ExecuteActivity(cctx, c.act, c.args...)
	}
	// ran reports whether compensation i may run: it renews the claim first, and says no
	// once the saga's outcome is found recorded.
	ran := make([]bool, len(s.comps))
	mayRun := func(i int) bool {
		if s.held && s.ended == nil {
			if err := s.hold(dctx); err != nil {
				workflow.GetLogger(ctx).Error("oncekit/saga: renew the saga's key", "key", string(s.key), "error", err)
			}
		}
		ran[i] = s.ended == nil
		return ran[i]
	}
	s.status.Phase, s.status.Since = "compensating", workflow.Now(ctx)
	finished := func(i int) {
		s.status.Compensating = slices.DeleteFunc(s.status.Compensating, func(n string) bool { return n == s.comps[i].name })
		result := "ok"
		if outcomes[i].Err != nil {
			result = "failed"
			outcomes[i].capped = s.capped(outcomes[i].Err)
		}
		s.status.Compensated = append(s.status.Compensated, s.comps[i].name+": "+result)
	}
	if s.opts.Parallel {
		futures := make([]workflow.Future, len(s.comps))
		if len(s.comps) > 0 && mayRun(0) {
			for i := len(s.comps) - 1; i >= 0; i-- {
				ran[i] = true
				futures[i] = run(i)
				s.status.Compensating = append(s.status.Compensating, s.comps[i].name)
			}
			for i := len(s.comps) - 1; i >= 0; i-- {
				outcomes[i].Err = futures[i].Get(dctx, nil)
				finished(i)
			}
		}
	} else {
		for i := len(s.comps) - 1; i >= 0; i-- {
			if !mayRun(i) {
				break
			}
			s.status.Compensating = []string{s.comps[i].name}
			outcomes[i].Err = run(i).Get(dctx, nil)
			finished(i)
		}
	}
	// Report in the order compensations ran: last step first.
	ordered := make([]Outcome, 0, len(outcomes))
	for i := len(outcomes) - 1; i >= 0; i-- {
		if ran[i] {
			ordered = append(ordered, outcomes[i])
		}
	}
	s.compensated = &CompensationError{Cause: cause, Outcomes: ordered}
	return s.compensated
}

// beginCompensating records that the saga is compensating, with cause and the steps
// registered so far, and returns the cause to report: this one, or the one an earlier
// run of the saga recorded.
func (s *Saga) beginCompensating(ctx workflow.Context, cause error) (reported, err error) {
	if s.ended != nil {
		return cause, nil
	}
	if s.marker != nil {
		return causeOf(s.marker), nil
	}
	mine := sagarec.Compensating{Steps: slices.Clone(s.status.Steps), Cause: encodeCause(cause)}
	if cause != nil {
		mine.ErrMessage = boundedText(cause.Error())
	}
	var app *temporal.ApplicationError
	if errors.As(cause, &app) {
		mine.ErrType = app.Type()
	}
	if mine.Steps == nil {
		mine.Steps = []string{}
	}
	for range 3 { // the key may be taken over and given back meanwhile
		var r sagarec.Recorded
		err := workflow.ExecuteLocalActivity(localOptions(ctx), sagarec.ActivityCompensating,
			sagarec.CompensatingRequest{BeginRequest: s.req, Compensating: mine}).Get(ctx, &r)
		if err != nil {
			return cause, err
		}
		if r.Held {
			if r, err = s.wait(ctx); err != nil {
				return cause, err
			}
			s.learn(r)
			if s.ended != nil {
				return cause, nil
			}
			if s.marker != nil {
				return causeOf(s.marker), nil
			}
			continue
		}
		s.learn(r)
		if s.ended != nil || s.marker == nil {
			return cause, nil
		}
		if s.marker.ErrMessage == mine.ErrMessage && s.marker.ErrType == mine.ErrType {
			return cause, nil // this run's record
		}
		return causeOf(s.marker), nil
	}
	return cause, nil
}

// boundedText keeps a recorded message short: a cause's text can be long.
func boundedText(msg string) string {
	const limit = 4 << 10
	if len(msg) <= limit {
		return msg
	}
	return strings.ToValidUTF8(msg[:limit], "") + "..."
}

// capped reports whether a compensation failed because Temporal's in-memory test
// environment stopped its "unlimited" attempts (at 10), which a real server never does: a
// retryable failure of a compensation without an attempt limit, ended neither by its
// deadline nor by a cancellation. (The in-memory environment reports no retry state.)
func (s *Saga) capped(err error) bool {
	p := s.opts.CompensationOptions.RetryPolicy
	if p != nil && p.MaximumAttempts != 0 {
		return false
	}
	var (
		aerr     *temporal.ActivityError
		app      *temporal.ApplicationError
		timeout  *temporal.TimeoutError
		canceled *temporal.CanceledError
	)
	if !errors.As(err, &aerr) || errors.As(err, &timeout) || errors.As(err, &canceled) {
		return false
	}
	if errors.As(err, &app) && (app.NonRetryable() || (p != nil && slices.Contains(p.NonRetryableErrorTypes, app.Type()))) {
		return false
	}
	switch aerr.RetryState() {
	case enumspb.RETRY_STATE_MAXIMUM_ATTEMPTS_REACHED, enumspb.RETRY_STATE_UNSPECIFIED:
		return true
	}
	return false
}

// Outcome is how one compensation ended.
type Outcome struct {
	// Step is the name of the compensated step.
	Step string
	// Err is nil when the compensation succeeded.
	Err error
	// capped is set when Err comes from the in-memory environment's cap on attempts.
	capped bool
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
			if o.capped {
				b.WriteString(" (after 10 attempts: Temporal's in-memory test environment stops \"unlimited\" retries there; " +
					"a real server retries a compensation until its 24-hour deadline)")
			}
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

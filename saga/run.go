package saga

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/internal/sagarec"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
)

// Operation is the operation saga keys are recorded under in the ledger.
const Operation = "oncekit.saga"

// causeOf returns the recorded failure as an error, or nil when the saga compensated
// without one.
func causeOf(c *sagarec.Compensating) error {
	if err := decodeCause(c.Cause); err != nil {
		return err
	}
	if c.ErrType == "" && c.ErrMessage == "" {
		return nil
	}
	// ErrMessage is the cause's whole text, which ends with its type when it is an
	// ApplicationError: say the type once.
	msg := strings.TrimSuffix(c.ErrMessage, " (type: "+c.ErrType+", retryable: false)")
	msg = strings.TrimSuffix(msg, " (type: "+c.ErrType+", retryable: true)")
	return temporal.NewNonRetryableApplicationError(msg, c.ErrType, nil)
}

// Run runs fn as the saga keyed by opts.Key and records how it ended under that key:
// completed with fn's result, or compensated with the error the workflow ends with.
//
// When fn returns an error, Run compensates every step registered so far (unless fn
// already called [Saga.Compensate]) and returns the compensation's non-retryable
// ApplicationError ([policy.ErrTypeCompensated] or [policy.ErrTypeCompensationFailed]). A run whose
// key already carries an outcome runs nothing and returns that outcome: the same result,
// or an ApplicationError of the same type and text. A run whose key is held by a run in
// flight waits for it and then returns its outcome. While it runs, a run renews its claim
// on the key, so no other run takes a live saga over; see the package documentation for
// resets, continue-as-new and runs that die.
//
// fn must not continue as new: a [workflow.ContinueAsNewError] from fn is refused, and
// the saga compensates with a cause of type [policy.ErrTypeContinueAsNewRefused].
//
// Recording goes through the activities oncekit.saga.Begin, oncekit.saga.Hold,
// oncekit.saga.Compensating and oncekit.saga.End on the ledger, so workflow code stays free of
// pgx. A worker that lacks them fails the workflow at once with
// [policy.ErrTypePluginMissing].
func Run[T any](ctx workflow.Context, opts *Opts, fn func(ctx workflow.Context, s *Saga) (T, error)) (T, error) {
	var zero T
	s, err := newSaga(ctx, opts)
	if err != nil {
		return zero, err
	}
	// Another run of this workflow with the key presents the same token: wait for it here,
	// since the ledger would take this run for that one.
	leave, err := s.enter(ctx)
	if err != nil {
		return zero, err
	}
	defer leave()
	s.status = Status{Key: s.key, Phase: "running"}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (Status, error) { return s.status, nil }); err != nil {
		return zero, err
	}
	if s.req, err = s.beginRequest(ctx); err != nil {
		return zero, err
	}
	if workflow.GetVersion(ctx, versionChange, workflow.DefaultVersion, versionHeld) == workflow.DefaultVersion {
		return runUnheld(ctx, s, fn)
	}
	s.held = true
	begun, err := s.begin(ctx)
	if err != nil {
		return zero, err
	}
	if begun.Ended {
		s.status.Phase = "ended"
		return replay[T](begun)
	}
	s.marker = begun.Compensating
	stop := s.keepHolding(ctx)
	defer stop()
	out, err := fn(workflow.WithValue(ctx, heldKey(s.key), true), s)
	return finish(ctx, s, out, err)
}

// The version of Run's commands, for workflow.GetVersion. A history written before the
// saga held its key (no marker) replays the commands it was written with.
const (
	versionChange = "oncekit.saga.held"
	versionHeld   = 1
)

// continueAsNewRefused is the cause a saga compensates with when fn continued as new.
const continueAsNewRefused = "oncekit/saga: the saga's function returned workflow.NewContinueAsNewError: " +
	"continue-as-new inside saga.Run is refused, because the new run would find the saga recorded as it ends here. " +
	"Return from the function and continue as new after saga.Run returns"

// finish compensates when the saga failed (or an earlier run of it began compensating),
// records the outcome, and returns what the key holds.
func finish[T any](ctx workflow.Context, s *Saga, out T, err error) (T, error) {
	var zero T
	var can *workflow.ContinueAsNewError
	if errors.As(err, &can) {
		err = temporal.NewNonRetryableApplicationError(continueAsNewRefused, policy.ErrTypeContinueAsNewRefused, nil)
	}
	for range 3 { // compensate, record; End may answer that the saga is compensating, once
		if s.ended != nil {
			s.status.Phase, s.status.Compensating = "ended", nil
			return replay[T](*s.ended)
		}
		var end sagarec.Recorded
		if err == nil && s.marker == nil {
			body, merr := json.Marshal(out)
			if merr != nil {
				return zero, fmt.Errorf("oncekit/saga: encode the saga's result: %w", merr)
			}
			end = sagarec.Recorded{Ended: true, Result: body}
		} else {
			cause := err
			if cause == nil {
				cause = causeOf(s.marker)
			}
			var cerr *CompensationError
			errors.As(s.Compensate(ctx, cause), &cerr) // Compensate always returns one
			if s.ended != nil {
				continue
			}
			out, err = zero, cerr.ApplicationError()
			// The message without the cause: the compensating record holds the cause, and
			// a replay rebuilds the error whole from both.
			end = sagarec.Recorded{Ended: true, ErrType: cerr.errType(), ErrMessage: cerr.summary()}
		}
		s.status.Phase, s.status.Compensating = "ended", nil
		var got sagarec.Recorded
		if rerr := s.record(ctx, end, &got); rerr != nil {
			return zero, errors.Join(err, fmt.Errorf("oncekit/saga: record the outcome under %s: %w", s.key, rerr))
		}
		switch {
		case got.Held:
			// Another run took the key over as this one ended: wait for it, then record
			// (or return what it recorded).
			r, werr := s.wait(ctx)
			if werr != nil {
				return zero, errors.Join(err, fmt.Errorf("oncekit/saga: record the outcome under %s: %w", s.key, werr))
			}
			s.learn(r)
			continue
		case got.Compensating != nil && !got.Ended:
			// A run of this saga (reset from this one, or one this run took it over from)
			// began compensating: the saga compensates.
			s.marker = got.Compensating
			continue
		case got.Ended && !sameOutcome(got, end):
			s.ended = &got
			continue
		}
		return out, err
	}
	return zero, temporal.NewNonRetryableApplicationError(
		"oncekit/saga: the saga's key changed under this run more than once: look at the key "+string(s.key), policy.ErrTypeInvalid, nil)
}

// record runs oncekit.saga.End, even when the workflow was cancelled meanwhile.
func (s *Saga) record(ctx workflow.Context, end sagarec.Recorded, got *sagarec.Recorded) error {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithActivityOptions(dctx, recordOptions())
	return workflow.ExecuteActivity(dctx, sagarec.ActivityEnd, sagarec.EndRequest{BeginRequest: s.req, Outcome: end}).Get(dctx, got)
}

// sameOutcome reports whether the key holds the outcome this run recorded.
func sameOutcome(got, sent sagarec.Recorded) bool {
	if got.ErrType != sent.ErrType || got.ErrMessage != sent.ErrMessage {
		return false
	}
	return got.ErrType != "" || bytes.Equal(got.Result, sent.Result)
}

// runUnheld is Run as it was before runs held their keys, for histories written then.
func runUnheld[T any](ctx workflow.Context, s *Saga, fn func(ctx workflow.Context, s *Saga) (T, error)) (T, error) {
	var zero T
	var begun sagarec.Recorded
	bctx := workflow.WithActivityOptions(ctx, recordOptions())
	if err := workflow.ExecuteActivity(bctx, sagarec.ActivityBegin, s.req).Get(bctx, &begun); err != nil {
		return zero, err
	}
	if begun.Ended {
		s.status.Phase = "ended"
		return replay[T](begun)
	}
	out, err := fn(workflow.WithValue(ctx, heldKey(s.key), true), s)
	var end sagarec.Recorded
	if err == nil {
		body, merr := json.Marshal(out)
		if merr != nil {
			return zero, fmt.Errorf("oncekit/saga: encode the saga's result: %w", merr)
		}
		end = sagarec.Recorded{Ended: true, Result: body}
	} else {
		var cerr *CompensationError
		errors.As(s.Compensate(ctx, err), &cerr) // Compensate always returns one
		err = cerr.ApplicationError()
		end = sagarec.Recorded{Ended: true, ErrType: cerr.errType(), ErrMessage: err.Error()}
	}
	s.status.Phase, s.status.Compensating = "ended", nil
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithActivityOptions(dctx, recordOptions())
	if rerr := workflow.ExecuteActivity(dctx, sagarec.ActivityEnd, sagarec.EndRequest{BeginRequest: s.req, Outcome: end}).Get(dctx, nil); rerr != nil {
		return zero, errors.Join(err, fmt.Errorf("oncekit/saga: record the outcome under %s: %w", s.key, rerr))
	}
	return out, err
}

func (s *Saga) beginRequest(ctx workflow.Context) (sagarec.BeginRequest, error) {
	fp, err := keys.FingerprintJSON(s.opts.Request)
	if err != nil {
		return sagarec.BeginRequest{}, fmt.Errorf("oncekit/saga: Opts.Request does not encode as JSON: %w", err)
	}
	info := workflow.GetInfo(ctx)
	// The same workflow run (and a reset of it) presents the same token.
	token := uuid.NewSHA1(uuid.NameSpaceURL, []byte("oncekit-saga\x00"+info.WorkflowExecution.ID+"\x00"+originalRun(info)+"\x00"+string(s.key)))
	return sagarec.BeginRequest{Key: string(s.key), Token: token, Lease: s.opts.Lease, Fingerprint: string(fp)}, nil
}

// begin claims the key: at once through the local activity, which also proves the
// worker can record sagas, then, if another run holds the key, by waiting for it.
func (s *Saga) begin(ctx workflow.Context) (sagarec.Recorded, error) {
	var r sagarec.Recorded
	if err := workflow.ExecuteLocalActivity(localOptions(ctx), sagarec.ActivityBegin, s.req).Get(ctx, &r); err != nil {
		if strings.Contains(err.Error(), "is not registered by the worker") {
			return r, pluginMissing()
		}
		return r, err
	}
	if r.Held {
		return s.wait(ctx)
	}
	return r, nil
}

// wait waits, through the Begin activity, for the run that holds the key: it returns
// that run's outcome, or this run's claim when that run's lease ran out.
func (s *Saga) wait(ctx workflow.Context) (sagarec.Recorded, error) {
	var r sagarec.Recorded
	bctx := workflow.WithActivityOptions(ctx, recordOptions())
	err := workflow.ExecuteActivity(bctx, sagarec.ActivityBegin, s.req).Get(bctx, &r)
	return r, err
}

func pluginMissing() error {
	return temporal.NewNonRetryableApplicationError("oncekit/saga: this worker cannot record sagas: "+sagarec.ActivityBegin+
		" is not registered on it. Add oncekit's plugin to the client (client.Options{Plugins: ...} with worker.NewPlugin), "+
		"or call activity.RegisterSaga and use worker.Interceptor on a worker built by hand; in a test on Temporal's own "+
		"environment, call testsuite.RegisterSagaInMemory(env)", policy.ErrTypePluginMissing, nil)
}

// hold renews the run's claim and learns what the key holds: an outcome (s.ended), a
// compensation begun (s.marker), or another run's claim, which it waits for.
func (s *Saga) hold(ctx workflow.Context) error {
	var r sagarec.Recorded
	if err := workflow.ExecuteLocalActivity(localOptions(ctx), sagarec.ActivityHold, s.req).Get(ctx, &r); err != nil {
		return err
	}
	if r.Held {
		// Another run took the saga over while this one was silent for a lease: wait for
		// it, and end as it does (or, if it died too, take the saga back).
		var err error
		if r, err = s.wait(ctx); err != nil {
			return err
		}
	}
	s.learn(r)
	return nil
}

// learn notes what the key holds.
func (s *Saga) learn(r sagarec.Recorded) {
	switch {
	case r.Ended:
		s.ended = &r
	case r.Compensating != nil && s.marker == nil:
		s.marker = r.Compensating
	}
}

// keepHolding renews the run's claim every third of the lease (at most once per
// holdEveryMin) until stop is called, so that a saga whose step or compensation retries
// through a long outage keeps its key. What a renewal finds is acted on at the next step
// or compensation, which asks again.
func (s *Saga) keepHolding(ctx workflow.Context) (stop func()) {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	hctx, cancel := workflow.WithCancel(dctx)
	every := max(s.opts.Lease/3, holdEveryMin)
	workflow.GoNamed(hctx, "oncekit.saga.hold", func(ctx workflow.Context) {
		for workflow.Sleep(ctx, every) == nil {
			_ = workflow.ExecuteLocalActivity(localOptions(ctx), sagarec.ActivityHold, s.req).Get(ctx, nil)
		}
	})
	return cancel
}

// holdEveryMin bounds how often a run renews its lease in the background, whatever the
// lease: a lease of a second or less can lapse between two renewals.
const holdEveryMin = time.Second

// recordOptions are the options of the Begin (when it waits) and End activities: short
// attempts (a lost worker's attempt is retried within seconds), retried like
// compensations, so they wait for a run in flight and outlive an outage.
func recordOptions() workflow.ActivityOptions {
	return policy.CompensationOptions(recordAttemptTimeout)
}

// localOptions are the options of the record activities run as local activities.
func localOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: recordAttemptTimeout, ScheduleToCloseTimeout: policy.CompensationDeadlineDefault,
		RetryPolicy: policy.CompensationRetryPolicy(),
	})
}

// recordAttemptTimeout bounds one attempt of a record activity.
const recordAttemptTimeout = 10 * time.Second

// replay returns a recorded outcome as Run returns a fresh one.
func replay[T any](r sagarec.Recorded) (T, error) {
	var out T
	if r.ErrType != "" {
		var cause error
		if r.Compensating != nil && !legacyMessage(r) {
			cause = causeOf(r.Compensating)
		}
		return out, temporal.NewNonRetryableApplicationError(r.ErrMessage, r.ErrType, cause)
	}
	if len(r.Result) > 0 {
		if err := json.Unmarshal(r.Result, &out); err != nil {
			return out, temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("oncekit/saga: the recorded result does not decode as %T: %v", out, err), policy.ErrTypeInvalid, nil)
		}
	}
	return out, nil
}

// RunErr is [Run] for a saga whose workflow returns only an error.
func RunErr(ctx workflow.Context, opts *Opts, fn func(ctx workflow.Context, s *Saga) error) error {
	_, err := Run(ctx, opts, func(ctx workflow.Context, s *Saga) (struct{}, error) { return struct{}{}, fn(ctx, s) })
	return err
}

package saga

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/policy"
)

// Names of the activities that record a saga's outcome in the ledger. Workers register
// them (oncekit's worker plugin and the testsuite environments do; see activity.RegisterSaga).
const (
	// ActivityBegin claims the saga's key, or returns the outcome recorded under it.
	ActivityBegin = "oncekit.saga.Begin"
	// ActivityEnd records the saga's outcome under its key.
	ActivityEnd = "oncekit.saga.End"
	// Operation is the operation saga keys are recorded under in the ledger.
	Operation = "oncekit.saga"
)

// BeginRequest is the input of [ActivityBegin].
type BeginRequest struct {
	Key keys.Key `json:"key"`
	// Token identifies the run that owns the key; the run's retried activities present
	// the same token and resume its claim.
	Token       uuid.UUID        `json:"token"`
	Lease       time.Duration    `json:"lease"`
	Fingerprint keys.Fingerprint `json:"fingerprint"`
}

// Outcome of a saga as recorded under its key; the output of [ActivityBegin] and the
// input of [ActivityEnd].
type Recorded struct {
	// Ended is true when the saga's outcome is recorded (Begin), or being recorded (End).
	Ended bool `json:"ended"`
	// Result is the saga's result as JSON, when it completed.
	Result json.RawMessage `json:"result,omitempty"`
	// ErrType and ErrMessage describe how it failed, when it did: the type and text of
	// the ApplicationError the saga ended with.
	ErrType    string `json:"err_type,omitempty"`
	ErrMessage string `json:"err_message,omitempty"`
}

// EndRequest is the input of [ActivityEnd].
type EndRequest struct {
	BeginRequest
	Outcome Recorded `json:"outcome"`
}

// Run runs fn as the saga keyed by opts.Key and records how it ended under that key:
// completed with fn's result, or compensated with the error the workflow ends with.
//
// When fn returns an error, Run compensates every step registered so far (unless fn
// already called [Saga.Compensate]) and returns the compensation's non-retryable
// ApplicationError ([policy.ErrTypeCompensated] or [policy.ErrTypeCompensationFailed]). A run whose
// key already carries an outcome runs nothing and returns that outcome: the same result,
// or an ApplicationError of the same type and text. A run whose key is held by a run still
// in flight waits for it (its Begin activity retries) and then returns its outcome; if
// that run's lease ([Opts].Lease) runs out first, this run takes the saga over, and
// its steps replay what the first run did.
//
// Recording goes through the [ActivityBegin] and [ActivityEnd] activities on the ledger,
// so workflow code stays free of pgx.
func Run[T any](ctx workflow.Context, opts *Opts, fn func(ctx workflow.Context, s *Saga) (T, error)) (T, error) {
	var zero T
	s, err := newSaga(ctx, opts)
	if err != nil {
		return zero, err
	}
	s.status = Status{Key: s.key, Phase: "running"}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (Status, error) { return s.status, nil }); err != nil {
		return zero, err
	}
	req, err := s.beginRequest(ctx)
	if err != nil {
		return zero, err
	}
	var begun Recorded
	bctx := workflow.WithActivityOptions(ctx, recordOptions())
	if err := workflow.ExecuteActivity(bctx, ActivityBegin, req).Get(bctx, &begun); err != nil {
		return zero, err
	}
	if begun.Ended {
		s.status.Phase = "ended"
		return replay[T](begun)
	}
	out, err := fn(ctx, s)
	var end Recorded
	if err == nil {
		body, merr := json.Marshal(out)
		if merr != nil {
			return zero, fmt.Errorf("oncekit/saga: encode the saga's result: %w", merr)
		}
		end = Recorded{Ended: true, Result: body}
	} else {
		var cerr *CompensationError
		errors.As(s.Compensate(ctx, err), &cerr) // Compensate always returns one
		err = cerr.ApplicationError()
		end = Recorded{Ended: true, ErrType: cerr.errType(), ErrMessage: err.Error()}
	}
	s.status.Phase, s.status.Compensating = "ended", nil
	// Record the outcome even when the workflow was cancelled meanwhile.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithActivityOptions(dctx, recordOptions())
	if rerr := workflow.ExecuteActivity(dctx, ActivityEnd, EndRequest{BeginRequest: req, Outcome: end}).Get(dctx, nil); rerr != nil {
		return zero, errors.Join(err, fmt.Errorf("oncekit/saga: record the outcome under %s: %w", s.key, rerr))
	}
	return out, err
}

func (s *Saga) beginRequest(ctx workflow.Context) (BeginRequest, error) {
	fp, err := keys.FingerprintJSON(s.opts.Request)
	if err != nil {
		return BeginRequest{}, fmt.Errorf("oncekit/saga: fingerprint Options.Request: %w", err)
	}
	info := workflow.GetInfo(ctx)
	// The same workflow run (and a reset of it) presents the same token.
	token := uuid.NewSHA1(uuid.NameSpaceURL, []byte("oncekit-saga\x00"+info.WorkflowExecution.ID+"\x00"+originalRun(info)+"\x00"+string(s.key)))
	return BeginRequest{Key: s.key, Token: token, Lease: s.opts.Lease, Fingerprint: fp}, nil
}

// recordOptions are the options of the Begin and End activities: short attempts (a lost
// worker's attempt is retried within seconds), retried like compensations, so they wait
// for a run in flight and outlive an outage.
func recordOptions() workflow.ActivityOptions {
	return policy.CompensationOptions(recordAttemptTimeout)
}

// recordAttemptTimeout bounds one attempt of the Begin and End activities.
const recordAttemptTimeout = 10 * time.Second

// replay returns a recorded outcome as Run returns a fresh one.
func replay[T any](r Recorded) (T, error) {
	var out T
	if r.ErrType != "" {
		return out, temporal.NewNonRetryableApplicationError(r.ErrMessage, r.ErrType, nil)
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

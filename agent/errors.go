package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/keys"
)

// Sentinel conditions. The typed errors below match them with [errors.Is].
var (
	// ErrArgumentsChanged: the call's place in the task was used before with other
	// arguments (the model changed its mind on a retry). The tool did not run.
	ErrArgumentsChanged = errors.New("oncekit/agent: the tool call was made before with other arguments")
	// ErrUncertain: the call may have acted and its outcome is not recorded (its answer
	// was lost, its agent died, or its output was over the ledger's body limit), and the
	// tool's provider takes no idempotency key, so the tool is not run again; or, for
	// any tool, this attempt's call ran after its lease had run out and another attempt
	// took it over before this one recorded the outcome.
	ErrUncertain = errors.New("oncekit/agent: the tool call may have happened and cannot be repeated safely")
	// ErrStaleOwner: the task's claim passed to another owner; this owner must stop.
	ErrStaleOwner = errors.New("oncekit/agent: the task is owned by another agent")
	// ErrTaskDone: the task was finished already.
	ErrTaskDone = errors.New("oncekit/agent: the task is finished")
	// ErrApprovalPending: the call waits for a person's decision.
	ErrApprovalPending = errors.New("oncekit/agent: the tool call waits for approval")
	// ErrRejected: a person rejected the call, or nobody decided before its deadline.
	ErrRejected = errors.New("oncekit/agent: the tool call was rejected")
)

// CallRef names one tool call: its place in a task. It is what the call's key is made
// of; the arguments are not part of it.
type CallRef struct {
	Tenant string
	Task   string
	Step   string
	Tool   string
	// Key is the ledger key of the call, made from the other fields.
	Key keys.Key
}

func (c CallRef) String() string {
	return fmt.Sprintf("tool %q at step %q of task %q (tenant %q)", c.Tool, c.Step, c.Task, c.Tenant)
}

// ArgumentsChangedError reports a call made at a place where another call was made
// before with other arguments. The tool did not run. Both argument sets are in
// canonical JSON, for the model and for the operator.
type ArgumentsChangedError struct {
	Call CallRef
	// Stored are the arguments the call was first made with.
	Stored json.RawMessage
	// New are the arguments of the refused call.
	New json.RawMessage
}

func (e *ArgumentsChangedError) Error() string {
	return fmt.Sprintf("oncekit/agent: %s was first made with other arguments (%s) than now (%s): the call is not made again; a new call needs a new step",
		e.Call, clip(e.Stored), clip(e.New))
}

// Is matches [ErrArgumentsChanged].
func (e *ArgumentsChangedError) Is(target error) bool { return target == ErrArgumentsChanged }

// UncertainError reports a call that may have acted without its outcome being recorded:
// its answer was lost, its agent died, or its output was over the ledger's body limit.
// The tool takes no downstream key, so repeating it could act twice: the tool is not run
// again. An operator settles the call with [Guard.Resolve].
//
// It also reports, for any tool, an attempt whose tool ran after the call's lease had
// run out and whose call another attempt took over before this one could record the
// outcome (Err then matches ledger.ErrLeaseLost): the record is the other attempt's,
// which makes the call again with the same downstream key, or reports it uncertain.
type UncertainError struct {
	Call CallRef
	// Attempt counts the attempts that claimed the call, this one included.
	Attempt int
	// Err is the error the call met when this attempt made it, such as a
	// ledger.BodyTooLargeError for an output over the limit; nil when an earlier
	// attempt made it.
	Err error
}

func (e *UncertainError) Error() string {
	s := fmt.Sprintf("oncekit/agent: %s may have happened (attempt %d)", e.Call, e.Attempt)
	if e.Err != nil {
		s += fmt.Sprintf(" (%v)", e.Err)
	}
	return s + ": it is not repeated; check the provider and settle it with Guard.Resolve"
}

// Is matches [ErrUncertain].
func (e *UncertainError) Is(target error) bool { return target == ErrUncertain }

// Unwrap returns the error the call met, if any.
func (e *UncertainError) Unwrap() error { return e.Err }

// StaleOwnerError reports that a task's claim is no longer this owner's: its lease ran
// out and another agent took the task over, or the task was finished. Nothing was done.
type StaleOwnerError struct {
	Tenant string
	Task   string
}

func (e *StaleOwnerError) Error() string {
	return fmt.Sprintf("oncekit/agent: task %q of tenant %q is no longer owned by this agent: stop working on it", e.Task, e.Tenant)
}

// Is matches [ErrStaleOwner].
func (e *StaleOwnerError) Is(target error) bool { return target == ErrStaleOwner }

// ApprovalPendingError reports a call frozen for a person's decision. Make the same
// call again after [Guard.Approve]; until then the tool does not run.
type ApprovalPendingError struct {
	Call CallRef
	// Deadline is when the call counts as rejected if nobody decides.
	Deadline time.Time
}

func (e *ApprovalPendingError) Error() string {
	return fmt.Sprintf("oncekit/agent: %s waits for approval until %s", e.Call, e.Deadline.UTC().Format(time.RFC3339))
}

// Is matches [ErrApprovalPending].
func (e *ApprovalPendingError) Is(target error) bool { return target == ErrApprovalPending }

// RejectedError reports a call a person rejected, or one whose approval deadline passed.
type RejectedError struct {
	Call CallRef
	// By and Reason are the decision's; By is empty when the deadline passed.
	By, Reason string
	// TimedOut is true when nobody decided before the deadline.
	TimedOut bool
}

func (e *RejectedError) Error() string {
	if e.TimedOut {
		return fmt.Sprintf("oncekit/agent: %s was not approved before its deadline, which counts as a rejection", e.Call)
	}
	return fmt.Sprintf("oncekit/agent: %s was rejected by %s: %s", e.Call, e.By, e.Reason)
}

// Is matches [ErrRejected].
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

// clip shortens arguments for an error message: an error never echoes unbounded input.
func clip(b []byte) string {
	const limit = 200
	if len(b) <= limit {
		return string(b)
	}
	return fmt.Sprintf("%s… (%d bytes)", b[:limit], len(b))
}

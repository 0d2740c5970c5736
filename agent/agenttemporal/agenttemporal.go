package agenttemporal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

// ActivityName is the name [Activities.CallTool] is registered under.
const ActivityName = "oncekit.agent.CallTool"

// The ApplicationError types of a tool activity's failures. Those of refused calls are
// non-retryable; an approval that is still pending is retried by the activity's retry
// policy until it is decided.
const (
	ErrTypeArgumentsChanged = "oncekit.agent.ArgumentsChanged"
	ErrTypeUncertain        = "oncekit.agent.Uncertain"
	ErrTypeRejected         = "oncekit.agent.Rejected"
	ErrTypeApprovalPending  = "oncekit.agent.ApprovalPending"
	ErrTypeUnknownTool      = "oncekit.agent.UnknownTool"
)

// ToolRequest is the input of the tool activity.
type ToolRequest struct {
	// Tenant owns the task.
	Tenant string
	// Step is the call's place in the workflow: its position, or a call ID recorded
	// by the workflow before the call.
	Step string
	// Tool names a tool registered with [Activities.Register].
	Tool string
	// Args are the model's arguments.
	Args json.RawMessage
}

// ToolResponse is the output of the tool activity.
type ToolResponse struct {
	Output   json.RawMessage
	Replayed bool
}

// ChangedDetails are the details of an [ErrTypeArgumentsChanged] failure.
type ChangedDetails struct {
	Step   string
	Tool   string
	Stored json.RawMessage
	New    json.RawMessage
}

type registered struct {
	tool agent.Tool
	fn   agent.ToolFunc
}

// Activities holds the agent's tools. Register its CallTool method on a worker under
// the name [ActivityName].
type Activities struct {
	g     *agent.Guard
	mu    sync.RWMutex
	tools map[string]registered
}

// New returns the tool activities of guard g.
func New(g *agent.Guard) *Activities {
	return &Activities{g: g, tools: map[string]registered{}}
}

// Register adds a tool. A tool registered twice keeps the later function.
func (a *Activities) Register(tool agent.Tool, fn agent.ToolFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tools[tool.Name] = registered{tool: tool, fn: fn}
}

// CallTool is the tool activity: it makes the call of req.Tool at req.Step of the task
// named by the workflow's ID, once (see agent.Task.Call).
func (a *Activities) CallTool(ctx context.Context, req ToolRequest) (ToolResponse, error) {
	a.mu.RLock()
	r, ok := a.tools[req.Tool]
	a.mu.RUnlock()
	if !ok {
		return ToolResponse{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("oncekit/agent: no tool %q is registered", req.Tool), ErrTypeUnknownTool, nil)
	}
	info := tactivity.GetInfo(ctx)
	task := a.g.Task(req.Tenant, info.WorkflowExecution.ID)
	res, err := task.Call(ctx, req.Step, r.tool, req.Args, r.fn, nil)
	if err != nil {
		return ToolResponse{}, toTemporal(err)
	}
	return ToolResponse{Output: res.Output, Replayed: res.Replayed}, nil
}

func toTemporal(err error) error {
	var (
		changed *agent.ArgumentsChangedError
		unc     *agent.UncertainError
		rej     *agent.RejectedError
		pend    *agent.ApprovalPendingError
		derr    *ledger.DefinitiveError
	)
	switch {
	case errors.As(err, &changed):
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeArgumentsChanged, nil,
			ChangedDetails{Step: changed.Call.Step, Tool: changed.Call.Tool, Stored: changed.Stored, New: changed.New})
	case errors.As(err, &unc):
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeUncertain, nil, unc.Call.Step, unc.Call.Tool)
	case errors.As(err, &rej):
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeRejected, nil, rej.By, rej.Reason, rej.TimedOut)
	case errors.As(err, &pend):
		return temporal.NewApplicationError(err.Error(), ErrTypeApprovalPending)
	case errors.As(err, &derr):
		return temporal.NewApplicationErrorWithOptions(derr.Error(), derr.Code, temporal.ApplicationErrorOptions{
			NonRetryable: true, Details: []any{derr.Code, derr.Message, derr.Replayed}})
	}
	return err
}

// ExecuteTool runs the tool activity from workflow code for the call of tool at step.
// When ctx carries no activity options it runs with a start-to-close timeout of one
// minute and Temporal's default retries.
func ExecuteTool(ctx workflow.Context, tenant, step, tool string, args json.RawMessage) (ToolResponse, error) {
	if workflow.GetActivityOptions(ctx).StartToCloseTimeout == 0 && workflow.GetActivityOptions(ctx).ScheduleToCloseTimeout == 0 {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	}
	var out ToolResponse
	err := workflow.ExecuteActivity(ctx, ActivityName, ToolRequest{Tenant: tenant, Step: step, Tool: tool, Args: args}).Get(ctx, &out)
	return out, err
}

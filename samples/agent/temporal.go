package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/agent/agenttemporal"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/ledger"
)

// temporalAgent is the oncekit agent whose loop is a Temporal workflow per ticket: the
// model call and every tool call are activities, and the tools run in worker processes
// that SIGKILL themselves after tool effects as the polling agents do.
const (
	temporalAgent = "temporal"
	taskQueue     = "support-agent"
	envTemporal   = "ONCEKIT_AGENT_TEMPORAL"
	envNamespace  = "ONCEKIT_AGENT_NAMESPACE"
)

// ticketOutcome is what a ticket's workflow reports.
type ticketOutcome struct {
	Outcome   string
	Changed   int
	Uncertain int
}

// ticketWorkflow asks the model, then makes each call it chose at its step; the task is
// the workflow's ID.
func ticketWorkflow(ctx workflow.Context, t ticket, delivery int) (ticketOutcome, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 2 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 1.5, MaximumInterval: time.Second}})
	var calls []call
	if err := workflow.ExecuteActivity(ctx, "model", t, delivery).Get(ctx, &calls); err != nil {
		return ticketOutcome{}, err
	}
	out := ticketOutcome{Outcome: "finished"}
	for i, c := range calls {
		_, err := agenttemporal.ExecuteTool(ctx, tenant, strconv.Itoa(i+1), c.Tool, c.Args)
		var appErr *temporal.ApplicationError
		if err != nil && errors.As(err, &appErr) {
			switch appErr.Type() {
			case agenttemporal.ErrTypeArgumentsChanged:
				out.Changed++ // the tool's first outcome stands
				continue
			case agenttemporal.ErrTypeUncertain:
				out.Uncertain++
				out.Outcome = "escalated"
				return out, nil
			case agenttemporal.ErrTypeRejected:
				out.Outcome = "escalated"
				return out, nil
			}
		}
		if err != nil {
			return ticketOutcome{}, err
		}
	}
	return out, nil
}

// temporalWorkerMain is a worker process of the Temporal agent.
func temporalWorkerMain(ctx context.Context, e *env) error {
	c, err := client.Dial(client.Options{HostPort: os.Getenv(envTemporal), Namespace: os.Getenv(envNamespace), Logger: devenv.QuietLogger()})
	if err != nil {
		return err
	}
	defer c.Close()
	l, err := ledger.New(e.pool, &ledger.Config{Schema: demoSchema})
	if err != nil {
		return err
	}
	// A tool call's lease lasts as long as its activity may run, after which Temporal
	// retries it.
	g, err := agent.New(l, &agent.Config{CallLease: 2 * time.Second, ApprovalTimeout: time.Minute})
	if err != nil {
		return err
	}
	acts := agenttemporal.New(g)
	for _, tool := range []agent.Tool{
		{Name: "refund", AcceptsKey: true},
		{Name: "refund_large", AcceptsKey: true, NeedsApproval: true},
		{Name: "send_email", AcceptsKey: true},
		{Name: "notify_team"},
	} {
		acts.Register(tool, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
			id, err := strconv.Atoi(strings.TrimPrefix(inv.Call.Task, "ticket-"))
			if err != nil {
				return nil, ledger.NotApplied(err)
			}
			name := strings.TrimSuffix(inv.Call.Tool, "_large")
			return e.run(ctx, ticket{ID: id}, call{Tool: name, Args: inv.Args}, keyFor(name, inv))
		})
	}
	w := tworker.New(c, taskQueue, tworker.Options{})
	w.RegisterWorkflow(ticketWorkflow)
	w.RegisterActivityWithOptions(acts.CallTool, tactivity.RegisterOptions{Name: agenttemporal.ActivityName})
	w.RegisterActivityWithOptions(func(ctx context.Context, t ticket, delivery int) ([]call, error) {
		// Asked again on a retry, the model may answer otherwise.
		calls := model(e.seed, t, delivery+int(tactivity.GetInfo(ctx).Attempt)-1)
		for i := range calls {
			if calls[i].Tool == "refund" && t.Amount >= approvalLimit {
				calls[i].Tool = "refund_large"
			}
		}
		return calls, nil
	}, tactivity.RegisterOptions{Name: "model"})
	if err := w.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	w.Stop()
	return nil
}

// keyFor is the Idempotency-Key a tool sends: the downstream key where the provider
// takes one.
func keyFor(tool string, inv agent.Invocation) string {
	if tool == "notify_team" {
		return ""
	}
	return string(inv.DownstreamKey)
}

// dispatch starts a workflow per delivery of the Temporal agent's inbox and records its
// outcome. A second delivery of a ticket whose workflow finished starts it again under
// the same ID, and the model is asked again.
func dispatch(ctx context.Context, e *env, c client.Client) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		d, err := e.pollFor(ctx, 30*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if d == nil {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		wg.Go(func() {
			run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "ticket-" + strconv.Itoa(d.t.ID), TaskQueue: taskQueue,
				WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
				WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING}, ticketWorkflow, d.t, d.attempt)
			if err != nil {
				return
			}
			var out ticketOutcome
			if err := run.Get(ctx, &out); err != nil {
				fmt.Fprintf(os.Stderr, "agent-demo: ticket %d's workflow: %v\n", d.t.ID, err)
				return
			}
			// A run that two deliveries waited for is counted once.
			first, err := e.firstOutcome(ctx, d.t.ID, out.Outcome)
			if err != nil {
				return
			}
			if first {
				for range out.Changed {
					e.event(ctx, d.t.ID, "changed", "send_email")
				}
				for range out.Uncertain {
					e.event(ctx, d.t.ID, "uncertain", "notify_team")
				}
			}
			_ = e.done(ctx, d)
		})
	}
	return nil
}

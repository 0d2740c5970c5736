package saga_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/ledger"
)

// workflowTasks returns the IDs of the WorkflowTaskCompleted events of a run: the points
// a reset can go back to, one per boundary between the saga's steps.
func workflowTasks(t *testing.T, c client.Client, run client.WorkflowRun) []int64 {
	t.Helper()
	var ids []int64
	it := c.GetWorkflowHistory(context.Background(), run.GetID(), run.GetRunID(), false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(t, err)
		if e.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			ids = append(ids, e.GetEventId())
		}
	}
	return ids
}

// reset resets run to the workflow task that completed at event, as `temporal workflow
// reset --event-id` does, and returns the reset run.
func reset(t *testing.T, c client.Client, run client.WorkflowRun, event int64) client.WorkflowRun {
	t.Helper()
	resp, err := c.ResetWorkflowExecution(context.Background(), &workflowservice.ResetWorkflowExecutionRequest{
		Namespace:                 "default",
		WorkflowExecution:         &commonpb.WorkflowExecution{WorkflowId: run.GetID(), RunId: run.GetRunID()},
		Reason:                    "test: reset a finished saga",
		WorkflowTaskFinishEventId: event,
		RequestId:                 uuid.NewString(),
	})
	require.NoError(t, err)
	return c.GetWorkflow(context.Background(), run.GetID(), resp.GetRunId())
}

// A saga that finished is reset to each of its workflow tasks in turn, and the reset run
// meets the opposite fortune: the step that worked now fails, or the step that failed now
// works. Whatever the boundary, the reset run returns the outcome recorded under the key,
// and the money is where that outcome says: moved once when it completed, back where it
// was when it compensated.
func TestRun_ResetOfFinishedSagaReplaysItsOutcome(t *testing.T) {
	t.Parallel()
	b := newServerBank(t)
	for _, tc := range []struct {
		name      string
		failFirst bool // notify fails in the first run (else in the reset run)
		state     ledger.State
		errType   string
		money     map[string]int
	}{
		{"Completed", false, ledger.StateCompleted, "", moved},
		{"Compensated", true, ledger.StateFailed, compensated, restored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A first saga counts the boundaries; every other saga is reset at one of them.
			finish := func(id string) (client.WorkflowRun, string, string) {
				if tc.failFirst {
					b.failing.Store(id, "notify")
				}
				run := b.start(t, "reset-"+id, order{ID: id})
				out, typ := result(t, run)
				require.Equal(t, tc.errType, typ)
				if tc.failFirst {
					b.failing.Delete(id)
				} else {
					b.failing.Store(id, "notify")
				}
				return run, out, typ
			}
			probe, _, _ := finish(tc.name + "-probe")
			boundaries := workflowTasks(t, b.c, probe)
			require.GreaterOrEqual(t, len(boundaries), 4, "a saga of three steps has a workflow task before each")
			for i := range boundaries {
				t.Run(fmt.Sprintf("Task%d", i+1), func(t *testing.T) {
					t.Parallel()
					id := fmt.Sprintf("%s-%d", tc.name, i+1)
					run, out, typ := finish(id)
					tasks := workflowTasks(t, b.c, run)
					require.Len(t, tasks, len(boundaries), "every saga of the test has the same shape")
					againOut, againType := result(t, reset(t, b.c, run, tasks[i]))
					state, code := b.recorded(t, id)
					require.Equal(t, tc.state, state, "the key keeps its outcome")
					require.Equal(t, tc.errType, code)
					require.Equal(t, typ, againType, "the reset run returns the recorded outcome")
					require.Equal(t, out, againOut, "the reset run returns the recorded result")
					require.Equal(t, tc.money, b.net(t, id), "the money agrees with the recorded outcome")
				})
			}
		})
	}
}

// A saga still running is reset while its compensations run (the deposit given back, the
// withdrawal's refund in flight) to the workflow task before its deposit. The reset run
// must not run the saga forward over money partly given back: it finds that the saga
// began compensating, replays the deposit, compensates every step, and the money is back
// where it was, each refund made once.
func TestRun_ResetDuringCompensationCompensates(t *testing.T) {
	t.Parallel()
	b := newServerBank(t)
	o := order{ID: "reset-compensating"}
	b.failing.Store(o.ID, "notify")
	open := make(chan struct{})
	b.undoGate.Store(o.ID, undoGate{step: "withdraw", open: open})
	run := b.start(t, "reset-compensating", o)
	select {
	case <-b.undoEntered:
	case <-time.After(time.Minute):
		t.Fatal("the withdrawal's compensation never started")
	}
	require.Equal(t, map[string]int{"withdraw": 1, "deposit": 0, "notify": 0}, b.net(t, o.ID), "the deposit was given back")
	b.failing.Delete(o.ID) // run forward, the reset run would now complete the order
	tasks := workflowTasks(t, b.c, run)
	reset := reset(t, b.c, run, tasks[1])
	close(open) // the refund in flight in the reset-away run lands too
	_, typ := result(t, reset)
	require.Equal(t, compensated, typ)
	state, code := b.recorded(t, o.ID)
	require.Equal(t, ledger.StateFailed, state)
	require.Equal(t, compensated, code)
	require.Equal(t, restored, b.net(t, o.ID))
}

package outboxtemporal

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/outbox"
)

// Start says which workflow an event starts.
type Start struct {
	// Workflow is the workflow type to start.
	Workflow string
	// Args are its arguments.
	Args []any
	// Options are the start options; ID is set from the event (see [NewPublisher]).
	Options client.StartWorkflowOptions
	// Signal, when set, makes the publication a signal-with-start: the event is sent to
	// the workflow as this signal, with SignalArg.
	Signal    string
	SignalArg any
}

// WorkflowIDPrefix prefixes the workflow IDs [NewPublisher] derives from event IDs.
const WorkflowIDPrefix = "outbox-"

// NewPublisher returns a publisher that starts a workflow per event, with the workflow ID "outbox-" and the
// event ID and the ID reuse policy set to reject duplicates, so a second publication of
// the event is rejected by Temporal itself (and counts as published) for as long as the
// namespace retains the first workflow. route maps an event to its workflow.
//
// With Start.Signal set, the event is signalled to the workflow with
// signal-with-start. Temporal deduplicates the start but not the signal: the signal's
// argument should carry the event ID so the workflow can ignore a repeated one.
func NewPublisher(c client.Client, route func(e outbox.Event) (Start, error)) outbox.Publisher {
	return outbox.PublisherFunc(func(ctx context.Context, e outbox.Event) error {
		st, err := route(e)
		if err != nil {
			return fmt.Errorf("%w: %w", outbox.ErrPermanent, err)
		}
		opts := st.Options
		opts.ID = WorkflowIDPrefix + e.ID.String()
		if st.Signal != "" {
			opts.ID = st.Options.ID
			if opts.ID == "" {
				return fmt.Errorf("%w: signal-with-start needs Options.ID (the workflow to signal)", outbox.ErrPermanent)
			}
			_, err := c.SignalWithStartWorkflow(ctx, opts.ID, st.Signal, st.SignalArg, opts, st.Workflow, st.Args...)
			return err
		}
		opts.WorkflowIDReusePolicy = enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE
		opts.WorkflowIDConflictPolicy = enums.WORKFLOW_ID_CONFLICT_POLICY_FAIL
		opts.WorkflowExecutionErrorWhenAlreadyStarted = true
		_, err = c.ExecuteWorkflow(ctx, opts, st.Workflow, st.Args...)
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if errors.As(err, &started) {
			return nil // published before: Temporal refused the duplicate
		}
		return err
	})
}

package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
)

// TemporalStart says which workflow an event starts.
type TemporalStart struct {
	// Workflow is the workflow type to start.
	Workflow string
	// Args are its arguments.
	Args []any
	// Options are the start options; ID is set from the event (see [TemporalPublisher]).
	Options client.StartWorkflowOptions
	// Signal, when set, makes the publication a signal-with-start: the event is sent to
	// the workflow as this signal, with SignalArg.
	Signal    string
	SignalArg any
}

// WorkflowIDPrefix prefixes the workflow IDs [TemporalPublisher] derives from event IDs.
const WorkflowIDPrefix = "outbox-"

// TemporalPublisher starts a workflow per event, with the workflow ID "outbox-" and the
// event ID and the ID reuse policy set to reject duplicates, so a second publication of
// the event is rejected by Temporal itself (and counts as published) for as long as the
// namespace retains the first workflow. route maps an event to its workflow.
//
// With TemporalStart.Signal set, the event is signalled to the workflow with
// signal-with-start. Temporal deduplicates the start but not the signal: the signal's
// argument should carry the event ID so the workflow can ignore a repeated one.
func TemporalPublisher(c client.Client, route func(e Event) (TemporalStart, error)) Publisher {
	return PublisherFunc(func(ctx context.Context, e Event) error {
		st, err := route(e)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPermanent, err)
		}
		opts := st.Options
		opts.ID = WorkflowIDPrefix + e.ID.String()
		if st.Signal != "" {
			opts.ID = st.Options.ID
			if opts.ID == "" {
				return fmt.Errorf("%w: signal-with-start needs Options.ID (the workflow to signal)", ErrPermanent)
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

// HTTPPublisher POSTs each event's payload to url with the event ID as the
// Idempotency-Key (a Structured Field string) and the topic as X-Event-Topic. A 2xx is
// success; 408, 409, 425, 429 and 5xx are retried; any other 4xx is permanent.
func HTTPPublisher(hc *http.Client, url string) Publisher {
	if hc == nil {
		hc = http.DefaultClient
	}
	return PublisherFunc(func(ctx context.Context, e Event) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(e.Payload))
		if err != nil {
			return fmt.Errorf("%w: %v", ErrPermanent, err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"`+e.ID.String()+`"`)
		req.Header.Set("X-Event-Topic", e.Topic)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		switch s := resp.StatusCode; {
		case s/100 == 2:
			return nil
		case s == 408 || s == 409 || s == 425 || s == 429 || s >= 500:
			return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
		default:
			return fmt.Errorf("%w: POST %s: %s: %s", ErrPermanent, url, resp.Status, bytes.TrimSpace(body))
		}
	})
}

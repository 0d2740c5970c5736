package keys

import (
	"errors"
	"fmt"
)

// Strategy chooses which parts of an activity's identity make its key.
type Strategy int

const (
	// RunScoped keys an activity by workflow run ID and activity ID. It is the default:
	// stable across all retries of one activity in one run, as Temporal advises. A reset
	// workflow runs under a new run ID, so its activities get new keys and run again.
	RunScoped Strategy = iota
	// WorkflowScoped keys an activity by workflow ID and activity ID. It survives a reset
	// of the run, but is unsafe across continue-as-new: the new run numbers its activities
	// from the start, so its first activity reuses the key of the old run's first activity.
	WorkflowScoped
	// BusinessScoped means the caller supplies the key (see [Business]).
	// [Identity.Key] refuses it, because an activity's identity carries no business
	// meaning.
	BusinessScoped
)

func (s Strategy) String() string {
	switch s {
	case RunScoped:
		return "run-scoped"
	case WorkflowScoped:
		return "workflow-scoped"
	case BusinessScoped:
		return "business"
	default:
		return fmt.Sprintf("Strategy(%d)", int(s))
	}
}

// ErrBusinessStrategy is returned by [Identity.Key] for [BusinessScoped]: business keys
// come from the caller, not from the activity's identity.
var ErrBusinessStrategy = errors.New("oncekit/keys: the business strategy takes a caller-supplied key: build it with keys.Business")

// Identity is the part of a Temporal activity's identity that keys are made from.
// Package activity reads it from a running activity.
type Identity struct {
	WorkflowID    string
	RunID         string
	ActivityID    string
	ActivityRunID string // set for standalone activities only
	Local         bool
}

// Key returns the key of this identity by strategy s.
//
// A standalone activity (one a client started, with no workflow) is always keyed by its
// activity ID and activity run ID ([Standalone]). A local activity is keyed like a
// regular one but in its own kind ([Local]), because local and regular activity IDs are
// numbered independently.
func (id Identity) Key(s Strategy) (Key, error) {
	if id.ActivityID == "" {
		return "", invalid("activity ID", "", -1, 0, ErrEmpty)
	}
	if id.WorkflowID == "" && id.RunID == "" {
		if id.ActivityRunID == "" {
			return "", invalid("activity run ID", "", -1, 0, ErrEmpty)
		}
		return Standalone(id.ActivityID, id.ActivityRunID), nil
	}
	switch s {
	case RunScoped:
		if id.Local {
			return Local(id.RunID, id.ActivityID), nil
		}
		return Run(id.RunID, id.ActivityID), nil
	case WorkflowScoped:
		if id.Local {
			return compose("lwf", id.WorkflowID, id.ActivityID), nil
		}
		return Workflow(id.WorkflowID, id.ActivityID), nil
	case BusinessScoped:
		return "", ErrBusinessStrategy
	default:
		return "", fmt.Errorf("oncekit/keys: unknown strategy %v", s)
	}
}

// Run returns the run-scoped key of activity activityID in workflow run runID.
func Run(runID, activityID string) Key { return compose("run", runID, activityID) }

// Workflow returns the workflow-scoped key of activity activityID in workflow workflowID.
// See [WorkflowScoped] for when it is stable.
func Workflow(workflowID, activityID string) Key {
	return compose("wf", workflowID, activityID)
}

// Local returns the run-scoped key of local activity activityID in workflow run runID.
func Local(runID, activityID string) Key { return compose("local", runID, activityID) }

// Standalone returns the key of a standalone activity: one started by a client rather
// than a workflow, identified by its activity ID and the run ID of this execution.
func Standalone(activityID, activityRunID string) Key {
	return compose("sa", activityID, activityRunID)
}

// Business returns a key built from caller-supplied business identity, such as an order
// ID and a step name: Business("order-42", "charge"). Every part must be non-empty.
// Business keys survive resets, continue-as-new and new workflows for the same intent.
func Business(parts ...string) (Key, error) {
	if len(parts) == 0 {
		return "", invalid("business key", "", -1, 0, ErrEmpty)
	}
	for _, p := range parts {
		if p == "" {
			return "", invalid("business key part", "", -1, 0, ErrEmpty)
		}
	}
	return compose("biz", parts...), nil
}

// Package agenttemporal runs an agent's tool calls as Temporal activities guarded by
// package agent: the workflow is the agent's loop, the model call and each tool call
// are activities, and a tool call's key is made from the workflow ID and the call's
// step, so a retried, reset or resubmitted workflow replays the calls it made.
//
// Register [Activities] on the worker with the agent's tools, and call
// [ExecuteTool] from the workflow. The model's decision is an ordinary activity whose
// result Temporal records; if a reset or a resubmission asks the model again and it
// chooses other arguments for a step that already ran, the tool activity fails with a
// non-retryable error of type [ErrTypeArgumentsChanged], carrying both argument sets,
// and the tool does not run again.
package agenttemporal

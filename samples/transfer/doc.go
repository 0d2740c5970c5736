// Package transfer is Temporal's money-transfer saga (the "saga" sample of samples-go)
// on oncekit, laid out as the sample is: the activities (activity.go), the workflow
// (workflow.go), the shared types (shared.go), a worker (worker/main.go), a starter
// (start/main.go) and the mocked unit test (workflow_test.go). The activities are
// functions, TransferDetails keeps its float32 amount, and the steps keep the sample's
// minute-long attempts and three-attempt retry policy.
//
// What changes: each movement of money goes through activity.ExternalErr and sends the
// bank the step's downstream key as its idempotency key; the workflow is a saga.RunErr
// keyed by the transfer's ReferenceID, whose compensations are registered before their
// step and retry through outages; each compensation reads its step's record
// (activity.StepResult) to know whether there is anything to undo; the worker dials with
// oncekit's plugin. The bank (bank.go) stands in for the bank's API.
//
// docs/transfer.md, at the repository's root, walks through the port file by file and
// compares it, under the same SIGKILLed workers, with the sample as it is and with a
// careful plain-Temporal version that sends the bank an idempotency key of its own.
package transfer

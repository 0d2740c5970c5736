// Package worker wires oncekit into a Temporal worker.
//
// [New] builds a worker whose activities find the ledger and their tenant in their
// context, so package activity's Do and External need no plumbing, and registers the
// activities package saga records outcomes with. A plain client from Temporal's
// client.Dial is enough: activities whose workflow carries no tenant run under
// [TenantDefault] (or [Options].DefaultTenant; [Options].RequireTenant refuses them), and
// the worker's interceptor carries the tenant, a step's key and a compensation's step from
// workflow code to the activity in its headers. For several tenants, [Dial] creates a
// client with oncekit's tenant propagator: a workflow started with a context from
// [keys.WithTenant] carries the tenant in its header to every activity it runs.
// Activities and workflows are registered under explicit names, because the name scopes
// the activity's keys and must not change when Go code is renamed. [policy.RetryPolicy]
// gives workflow code retry defaults that skip oncekit's non-retryable error types.
//
// This package shares its name with Temporal's go.temporal.io/sdk/worker; a typical
// worker main imports ours alone. A file that needs both imports Temporal's as tworker:
//
//	import tworker "go.temporal.io/sdk/worker"
package worker

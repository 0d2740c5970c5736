// Package worker wires oncekit into Temporal's workers through the SDK's plugin API.
//
// [NewPlugin] returns oncekit's plugin. Put it in Temporal's client.Options.Plugins,
// and every worker created from that client picks it up (or put it in one worker's
// Options.Plugins): workers stay Temporal's own, built with client.Dial and Temporal's
// worker.New. On each worker the plugin installs [Interceptor], which puts the ledger and
// the tenant in every activity's context, so that package activity's Do and External
// need no plumbing, and carries the tenant, a step's key and a compensation's step from
// workflow code to the activity in its headers; and it registers the activities package
// saga records outcomes with (activity.RegisterSaga).
//
// # Tenants
//
// Activities whose workflow carries no tenant run under [TenantDefault], or
// [Config].DefaultTenant; with [Config].RequireTenant they fail instead. For several
// tenants, start workflows with a context from [keys.WithTenant] through a client that
// has the plugin: its [ClientInterceptor] writes the tenant into the workflow's header,
// and [Interceptor] carries it from there to every activity and child workflow the
// workflow runs. These two are the only writers and readers of oncekit's headers.
//
// # Names
//
// Activities keep the names Temporal gives them (a function's name, or a registered
// struct's method names), and that name is the operation that scopes their keys: keep it
// stable when Go code is renamed, as Temporal already asks of activity names.
// policy.RetryPolicy gives workflow code retry defaults that skip oncekit's
// non-retryable error types.
//
// This package shares its name with Temporal's go.temporal.io/sdk/worker. A worker main
// needs both, and imports Temporal's as tworker:
//
//	import tworker "go.temporal.io/sdk/worker"
package worker

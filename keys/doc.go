// Package keys names business intents so that a repeated intent can be recognised.
//
// # Keys and scopes
//
// A [Key] names one business intent: "charge order 42", not "the third TCP attempt to
// charge order 42". Every key lives inside a [Scope], the pair of a tenant and an
// operation, so unrelated requests cannot collide and one tenant can never read another
// tenant's stored result. Both are validated: a key is 1 to [MaxLenDefault] bytes of
// printable ASCII, which is what payment providers and the Idempotency-Key HTTP header
// accept downstream. Validation failures are [*ValidationError] values that wrap one of
// the sentinels ([ErrEmpty], [ErrTooLong], [ErrInvalidByte]).
//
// # Strategies
//
// A key for a Temporal activity comes from the activity's [Identity] by a [Strategy]
// (package activity reads the identity from the activity's context):
//
//   - [RunScoped] (the default): workflow run ID + activity ID. Stable across every retry
//     of the activity within one run. A workflow reset starts a new run, so the reset
//     run's activities get new keys and will run their effects again.
//   - [WorkflowScoped]: workflow ID + activity ID. Survives a reset, but after
//     continue-as-new the new run numbers its activities from the start again, so an
//     activity in the new run can reuse a key of the old run with a different intent.
//   - [BusinessScoped]: a key the caller supplies, such as an order ID and a step name
//     ([Business]). Stable across resets, continue-as-new and new workflows alike; it is
//     as good as the business identity it is built from.
//
// Local activities and standalone activities (started by a client rather than a
// workflow) are recognised and get their own key kinds, see [Local] and [Standalone].
// Everything in this package is pure and deterministic, safe in workflow code, and free
// of Temporal and database imports, so the ledger can use it without either.
//
// # Context values
//
// [TenantContextKey] and [KeyContextKey] carry a tenant and a key in Go and workflow
// contexts; [TenantFrom] and [KeyFrom] read them from either.
//
// # Derived keys
//
// [Derive] makes a child key for a compensation ("refund") or a downstream call
// ("stripe-charge") from a parent key. The child is deterministic, short, opaque to the
// provider it is sent to, collision resistant (128 bits of SHA-256) and begins with the
// purpose so it stays readable in logs.
//
// # Fingerprints
//
// A [Fingerprint] identifies a request's payload, so the same key reused with a different
// payload can be rejected. [FingerprintJSON] hashes the canonical form of a JSON value
// ([CanonicalJSON]: sorted object members, no insignificant white space, numbers by value),
// so field order, spacing and number formatting do not change it; [FingerprintBytes]
// hashes raw bytes. Fingerprints carry a version prefix so the encoding can evolve.
package keys

// Package ledger is oncekit's dedup ledger: a table in your PostgreSQL database that
// records each business intent by (tenant, operation, key), so a repeated intent
// replays its first result instead of producing a second effect.
//
// # Local mutations
//
// [Ledger.Do] claims the key and runs your mutation in one transaction, stores the
// mutation's [Response], and commits once: the record and the mutation exist together or
// not at all, guarded by the table's primary key. A retry returns the stored response
// byte for byte with Result.Replayed set, and nothing the mutation does commits (in
// every mode but [ModeOptimistic], its statements do not even run).
// The same key with a different [keys.Fingerprint] is refused with a
// [*FingerprintMismatchError]. [Ledger.DoTx] does the same inside a transaction you
// already hold.
//
// # One statement
//
// [Ledger.DoStatement] is the cheapest guarded write, cheaper than the bare pgx.BeginFunc
// transaction: a mutation that is one INSERT, UPDATE or DELETE with RETURNING (or a WITH
// query of them) runs with the claim and the record in a single statement that commits
// by itself, in one round trip; a replay takes one round trip and writes nothing. The
// statement's rows, as JSON, are the stored response. A taken key stops the statement
// before it runs.
//
// # Modes
//
// DoOpts.Mode says when the claim's answer arrives. By default
// ([ModeClaimWithFirstStatement]) the claim travels with the mutation's first
// statement, so a first execution costs the round trips of the bare transaction less
// BEGIN's, and a taken key stops that statement before it runs. [ModeClaimFirst]
// answers before the mutation is called, for a mutation that acts outside the database
// first; [ModeLookUpFirst] reads the record first, so a replay takes one round trip that
// neither locks nor writes; [ModeOptimistic] sends no claim at all, for a mutation that
// acts through its transaction alone. Whatever the mode, one call runs the mutation at
// most once.
//
// # External effects
//
// A call outside the database, such as a payment API, cannot join the transaction. It
// takes two commits: [Ledger.Claim] records a pending claim with a [Lease] and an owner
// token before the call; [Ledger.Complete] stores the outcome after it. If the process
// dies in between, the lease runs out and the next attempt takes the key over with
// Lease.Redrive set, and repeats the call with the same downstream key (see
// [keys.Derive]) so the provider deduplicates it. Only the token's holder may finish the
// record: a stale owner gets a [*LeaseLostError].
//
// # Failures
//
// A mutation that returns a [*DefinitiveError] (a declined card) has its writes rolled
// back and the failure stored; every retry receives the same failure. Any other error
// but one rolls back everything and leaves the key free for the next attempt. The one
// is an [*OutcomeUnknownError] (errors.Is [ErrOutcomeUnknown]): the commit was sent and
// its answer lost (a FATAL, a broken connection, a context that ended), so the
// mutation may have committed; it is never a rollback, and a retry with the same key
// settles it, replaying the result if the commit happened. A concurrent
// duplicate waits up to DoOpts.Wait (and no longer than its context's deadline): when
// the attempt holding the key completes, the duplicate replays its result; when that
// attempt fails, one waiter takes the key and runs its mutation, and the others replay
// that. A duplicate that runs out of wait fails with a retryable [*InProgressError].
//
// # Retention
//
// Records are kept for the replay horizon of their operation ([Config].Retention and
// Config.OperationRetention). An expired record counts as absent, checked in SQL at
// every read: a retry that arrives after expiry is a new intent and runs again, once;
// its record replaces the expired one, purged or not.
// [Ledger.Purge] deletes expired records in batches and may run on many nodes at once.
//
// # Telemetry
//
// With [Config].MeterProvider set, the ledger records, through the OpenTelemetry metric
// API:
//
//   - oncekit.ledger.calls ({call}): every call, with attributes oncekit.call (Do, DoTx,
//     DoStatement, Claim, Complete, Fail, Release, MarkUncertain), oncekit.operation and oncekit.outcome
//     (the Outcome constants: first, replay, failed, key_reused, in_progress,
//     snapshot_conflict, redrive, completed, released, uncertain, lease_lost, error);
//   - oncekit.ledger.call.duration (s): each call from its start to its commit or answer;
//   - oncekit.ledger.wait.duration (s): time waited for another attempt holding the key;
//   - oncekit.ledger.purge.deleted ({record}): records deleted by [Ledger.Purge];
//   - oncekit.ledger.pending ({record}): a gauge of pending external claims, counted at
//     collection from an index of pending records, with attribute oncekit.lease: live,
//     or expired for a claim stuck until an attempt takes it over or an operator
//     releases it.
//
// The duration histograms advise bucket boundaries from 1 ms to 10 s, so an SDK left at
// its defaults gives useful percentiles; the meter and tracer carry the module's version.
// Calls are recorded with their context, so an SDK that keeps exemplars links them to
// the call's span. The tenant and key are left out of metrics, which would otherwise
// grow a series per customer. With [Config].TracerProvider set, every call is a span (oncekit.ledger.Do and
// so on) carrying oncekit.tenant, oncekit.operation and oncekit.outcome, never the key's
// value or a body; it is a child of the span in the caller's context, such as the
// activity span of Temporal's tracing interceptor, and the mutation's own database spans
// nest under it. [Config].Logger receives a warning per take-over of an expired claim and
// a line per purge. With neither set, a call costs a branch.
//
// # Operating
//
// [Ledger.List], [Ledger.Stats], [Ledger.Change] and [Ledger.Audit] are what the oncekit
// command runs for an operator: find records by tenant, operation, time and key, and
// release a stuck claim or evict a wrong result, with an audit row that says who did it,
// when, why and what the record held. A record carries its [Origin], the Temporal
// workflow, run and activity that wrote it, when the writer's context has one
// ([WithOrigin]; oncekit's worker plugin sets it for every activity), so an operator finds
// a workflow's records from its workflow ID whatever their keys are made of.
//
// # Schema
//
// [Migrate] creates the table in its own schema ([SchemaDefault] by default) from
// embedded, numbered SQL files, which [Migrations] also exposes as plain SQL; package
// migrate applies every feature's line.
package ledger

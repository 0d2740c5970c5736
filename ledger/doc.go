// Package ledger is oncekit's dedup ledger: a table in your PostgreSQL database that
// records each business intent by (tenant, operation, key), so a repeated intent
// replays its first result instead of producing a second effect.
//
// # Local mutations
//
// [Ledger.Do] claims the key and runs your mutation in one transaction, stores the
// mutation's [Response], and commits once: the record and the mutation exist together or
// not at all, guarded by the table's primary key. A retry returns the stored response
// byte for byte with Result.Replayed set, without running anything, in one round trip
// that neither locks nor writes. The same key with a different [keys.Fingerprint] is
// refused with a [*FingerprintMismatchError]. [Ledger.DoTx] does the same inside a
// transaction you already hold.
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
// rolls back everything and leaves the key free for the next attempt. A concurrent
// duplicate waits up to DoOpts.Wait and then replays, or fails fast with a retryable
// [*InProgressError].
//
// # Retention
//
// Records are kept for the replay horizon of their operation ([Config].Retention and
// Config.OperationRetention). An expired record counts as absent, checked in SQL at
// every read: a retry that arrives after expiry is a new intent and runs again.
// [Ledger.Purge] deletes expired records in batches and may run on many nodes at once.
//
// # Schema
//
// [Migrate] creates the table in its own schema ([SchemaDefault] by default) from
// embedded, numbered SQL files, which [Migrations] also exposes as plain SQL.
package ledger

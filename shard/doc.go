// Package shard places tenants on independent PostgreSQL clusters: a [Router] maps a
// tenant to the [Shard] that holds its records, and the ledger, the inbox and the outbox
// take a router where they take a pool.
//
// # Placement
//
// A [Picker] names a tenant's shard. [Hash] spreads tenants over named shards by
// rendezvous hashing, so the order the shards are listed in does not matter; [Map]
// places named tenants explicitly and hands the rest to another picker. A picker must
// give a tenant the same shard for as long as its records are kept: the records that
// make a retry a replay are on the shard that took the first attempt, and a tenant moved
// to another shard runs its side effects again. Adding a shard to [Hash] moves about one
// tenant in (n+1), so grow with [Map] entries for the tenants that stay, or move each
// moved tenant's records with it, while no worker runs its calls.
//
// # What is routed
//
// A ledger on a router (ledger.NewSharded) runs each call on its tenant's shard: Do,
// Claim and the finishing calls, Get, and every operator call on one record. Calls that
// take the caller's transaction run where that transaction is, so open it on the
// tenant's pool ([Router.Pool]). Calls over many records (List, Stats, Purge) run on
// every shard in turn. The inbox routes Handle by the tenant that keys.WithTenant put in
// the context; the outbox enqueues in the caller's transaction, and each shard gets a
// dispatcher of its own.
//
// # Failures
//
// A shard that is down fails the calls of its tenants only; the other shards' calls go
// on. A tenant no picker places, or a picker naming a shard the router lacks, is an
// [*UnroutableError]; a transaction on another shard than its tenant's, a
// [*WrongShardError].
package shard

// Package inbox is processed-message tracking for consumers: a message is handled at
// most once per subscriber, in the same transaction as the handler's writes.
//
// [Inbox.Handle] begins a transaction, records (subscriber, message ID) under a unique
// constraint, and runs the handler. A message already recorded is detected in that
// transaction and skipped, and the caller acks it. A handler that fails rolls back,
// record included, so the message is handled again on redelivery; a handler that
// returns a definitive failure (ledger.Definitive) has its writes undone and the message
// recorded as rejected, so a poison message is not retried forever.
//
// By default ([ModeRecordFirst]) the record's answer arrives before the handler is
// called, in a round trip of its own that carries BEGIN: a handler that sends one
// statement takes the three round trips of pgx.BeginFunc. With
// [ModeRecordWithFirstStatement] the record travels in the round trip of the handler's
// first statement instead, two round trips in all; the handler is then called for a
// duplicate too, and its statements return [ErrDuplicate] without running.
//
// # Why the choice is in Config, and defaults the other way round
//
// The ledger's default sends the claim with the mutation's first statement, and
// DoOpts.Mode picks per call. The inbox's default answers first, and the mode is set
// once per [Inbox]. A handler is called by a consumer loop for every message of a
// subscription, not by the code that knows what one call does: whether a handler may
// be called for a duplicate (it logs, calls an API, or counts before its first
// statement) is a property of the handler, fixed when it is written, so it is fixed
// with the Inbox it is given to; two kinds of handler on one pool take two Inboxes. And
// a broker's redelivery is the common case rather than the exception it is for a
// client's retry, so the default is the mode that never calls a handler for a
// duplicate, whatever the handler does before its first statement.
//
// # Why the inbox has a table of its own
//
// The ledger's Do could hold these records (the subscriber as the tenant, the
// message ID as the key), but its claim is made for intents that carry a payload and a
// result: a transaction-scoped advisory lock, a look for a live record, and the record
// with its fingerprint and response written at commit. A message needs none of that: its
// record is the claim, one row of (subscriber, message ID) inserted with the handler's
// first statement, whose unique index makes a concurrent duplicate wait and then
// answers it. Measured side by side in `make bench` (inbox.first_vs_bare and
// inbox.on_ledger_vs_bare), a handler under the inbox's ModeRecordWithFirstStatement
// costs 1.04 × the bare transaction, and the same handler under the ledger's
// ModeClaimWithFirstStatement, the cheapest ledger mode that keeps a duplicate's
// statements from running, 1.13 × (1.10 × the inbox's): the claim's lock, look-up and
// savepoint are what the difference buys, and a consumer pays it on every message.
//
// Delivery from a broker or an outbox is at least once; the inbox turns it into one
// effect. Records are kept for [Config].Retention and purged in batches by
// [Inbox.Purge]; a redelivery after that is handled as new. The table is created by
// the inbox's migration line ([Migrations]; migrate.Up applies every line).
package inbox

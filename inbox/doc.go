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
// By default the record's answer arrives before the handler is called, in a round trip
// of its own that carries BEGIN: a handler that sends one statement takes the three
// round trips of pgx.BeginFunc. With [Config].FirstAttempt the record travels in the
// round trip of the handler's first statement instead, two round trips in all; the
// handler is then called for a duplicate too, and its statements return [ErrDuplicate]
// without running.
//
// Delivery from a broker or an outbox is at least once; the inbox turns it into one
// effect. Records are kept for [Config].Retention and purged in batches by
// [Inbox.Purge]; a redelivery after that is handled as new. The table is created by
// the inbox's migration line ([Migrations]; migrate.Up applies every line).
package inbox

// Package outbox is a transactional outbox: events enqueued in a business transaction
// exist if and only if it commits, and dispatchers publish them.
//
// # Enqueue
//
// [Outbox.Enqueue] inserts an [Event] in the caller's pgx.Tx. Each event has a stable ID
// (a UUID, given or generated), which consumers use as their deduplication key (see
// package inbox), a topic, an optional ordering key and a payload.
//
// # Dispatch
//
// A [Dispatcher] claims batches of pending events with FOR UPDATE SKIP LOCKED, so
// several dispatchers may run at once, publishes them through a [Publisher], and marks
// them published in the same transaction that holds the claim. It wakes on
// LISTEN/NOTIFY, and polls as the fallback. A failed publish is retried with
// exponential backoff; an event that keeps failing moves to the dead state, where
// [Outbox.Dead] lists it and [Outbox.Retry] sends it again. With Ordered set, events of
// one ordering key are published one at a time, in the order they were enqueued.
//
// # At least once
//
// Delivery is at least once, and says so: a dispatcher that dies after publishing and
// before its transaction commits leaves the events pending, and they are published
// again. Exactly-once effects come from the consumer's inbox, keyed by the event ID.
// The publishers here carry that ID: [TemporalPublisher] uses it as the workflow ID, so
// Temporal itself rejects a duplicate start; [HTTPPublisher] sends it as the
// Idempotency-Key.
package outbox

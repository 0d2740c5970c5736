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
// A [Dispatcher] claims a batch of ready events (FOR UPDATE SKIP LOCKED, so several
// dispatchers share the work) by setting a lease on them, and commits the claim at
// once: no row lock is held while it publishes. It publishes the events one by one
// through a [Publisher], each within DispatcherConfig.PublishTimeout, and then records
// the outcomes. A publication that fails or times out is retried with exponential
// backoff counted from the failure; an event that keeps failing moves to the dead state,
// where [Outbox.Dead] lists it and [Outbox.Retry] sends it again. A dispatcher renews
// its lease while it works; one that dies leaves its unfinished events to the others
// when the lease runs out. It listens for notifications on a connection of its own, so
// the pool's connections all serve dispatching, and it keeps dispatching while there is
// ready work: polling is the fallback for missed notifications, not a rate.
//
// # Ordered
//
// With DispatcherConfig.Ordered, the events of one ordering key are published in their
// outbox order, which is exactly this:
//
//   - Enqueue takes a lock on each ordering key it writes, held until the producer's
//     transaction ends, so the producers of one key take turns and a key's outbox order
//     is the order their transactions committed.
//   - An event is published only when every earlier pending event of its key has been
//     published or has gone dead: a failing event holds back the rest of its key.
//   - A dead event that is retried is published after the events of its key that
//     overtook it while it was dead.
//   - Only ordered dispatchers keep the order: an unordered dispatcher on the same
//     outbox publishes whatever is ready. Run one kind per outbox.
//
// Ordered claims take turns across dispatchers, and a key's events are published one
// after another, so one key drains at the speed of one dispatcher's publications.
// # At least once
//
// Delivery is at least once, and says so: a dispatcher that dies after publishing and
// before its transaction commits leaves the events pending, and they are published
// again. Exactly-once effects come from the consumer's inbox, keyed by the event ID.
// The publishers carry that ID: outboxtemporal.NewPublisher uses it as the workflow ID, so
// Temporal itself rejects a duplicate start; [HTTPPublisher] sends it as the
// Idempotency-Key.
package outbox

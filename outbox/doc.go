// Package outbox is a transactional outbox: events enqueued in a business transaction
// exist if and only if it commits, and dispatchers publish them.
//
// # Enqueue
//
// [Outbox.Enqueue] inserts an [Event] in the caller's pgx.Tx. Each event has a stable ID
// (a UUID, given or generated), which consumers use as their deduplication key (see
// package inbox), a topic, an optional ordering key and a payload. It also keeps the
// producer's trace context (Config.Propagator), so that the span of its publication
// links to the trace that created it.
//
// # Dispatch
//
// A [Dispatcher] claims a batch of ready events (FOR UPDATE SKIP LOCKED, so several
// dispatchers share the work) by giving them a lease and an owner token of its own, and
// commits the claim at once: no row lock is held while it publishes. It publishes the
// events one by one through a [Publisher], each within DispatcherConfig.PublishTimeout,
// starting one only while the lease covers it with room to spare and renewing the lease
// otherwise (DispatcherConfig.Lease gives the rule). Every renewal, release and outcome
// names the owner token and counts the rows it touched: a dispatcher whose lease ran out
// and whose events another dispatcher claimed (its pool gave it no connection for
// longer than the lease, say) changes nothing of the other's, publishes none of those
// events, drops the rest of its batch and reports [ErrLeaseLost].
//
// The publications are recorded when the batch ends, or earlier with a renewal or a
// failure. A failure is recorded at once, and the event retried with exponential backoff counted
// from the failure, by whichever dispatcher finds it ready then; an event that keeps
// failing moves to the dead state, where [Outbox.Dead] lists it and [Outbox.Retry]
// enqueues it anew. A dispatcher that dies leaves its unfinished events to the others
// when the lease runs out. It listens for notifications on a connection of its own,
// outside the pool's MaxConns (count one per dispatcher when sizing the server's
// max_connections), so the pool's connections all serve dispatching, and it keeps
// dispatching while there is ready work: polling is the fallback for missed
// notifications, not a rate.
//
// # Ordered
//
// With DispatcherConfig.Ordered, the events of one ordering key are published in their
// outbox order, one at a time, which is exactly this:
//
//   - Enqueue takes a lock on each ordering key it writes, held until the producer's
//     transaction ends, so the producers of one key take turns and a key's outbox order
//     is the order their transactions committed. Two producers that enqueue the same
//     keys in opposite order across separate Enqueue calls can wait for each other;
//     one of them gets an [*OrderingKeyDeadlockError] and runs again.
//   - An event is published only when every earlier pending event of its key has been
//     published or has gone dead: a failing event holds back the rest of its key, and
//     the held-back events go back to the outbox with the failure.
//   - A dead event that is retried is enqueued anew: it comes after every event of its
//     key enqueued before the retry, those that overtook it while it was dead and those
//     in flight included.
//   - Only ordered dispatchers keep the order: an unordered dispatcher on the same
//     outbox publishes whatever is ready. Run one kind per outbox.
//
// A publisher that ignores its context and runs past PublishTimeout is abandoned an
// eighth of the lease after the deadline; it may then still be running when the next
// event of its key starts. Ordered claims take turns across dispatchers, and a key's
// events are published one after another, so one key drains at the speed of one
// dispatcher's publications.
//
// # At least once
//
// Delivery is at least once, and says so: a dispatcher that dies after publishing and
// before it records the publication leaves the event pending, and it is published
// again when the lease runs out; a publication cut short by a stopping dispatcher is
// published again at once. Neither counts as a failed publication ([Event.Attempts]):
// its outcome is unknown. Exactly-once effects come from the consumer's inbox,
// keyed by the event ID. The publishers carry that ID: outboxtemporal.NewPublisher uses
// it as the workflow ID, so Temporal itself rejects a duplicate start; [HTTPPublisher]
// sends it as the Idempotency-Key.
//
// # Telemetry
//
// With a TracerProvider, Enqueue has a span (oncekit.outbox.enqueue, the messaging
// "create" operation) whose context each event keeps, and each publication has one
// (oncekit.outbox.publish, "send") linked to it; both carry the OpenTelemetry messaging
// attributes. With a MeterProvider, the outbox counts publications, failures and dead
// events, times publications, and reports its backlog (oncekit.outbox.backlog), counted
// from the indexes of pending and dead events without reading published ones.
package outbox

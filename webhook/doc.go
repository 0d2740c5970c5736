// Package webhook receives webhooks exactly once: it verifies the signature on the raw
// body, deduplicates on the delivery ID with the oncekit ledger, and hands the delivery to
// your handler inside the ledger's transaction.
//
// # Verification first
//
// A [Verifier] checks the signature before anything else touches the request, comparing
// in constant time; a missing or bad signature answers 401 and does no database work.
// [GitHub] verifies X-Hub-Signature-256 (HMAC-SHA256) and takes the delivery ID from
// X-GitHub-Delivery; [StandardWebhooks] verifies the Standard Webhooks scheme
// (webhook-id, webhook-timestamp, webhook-signature) with a timestamp tolerance.
// Implement Verifier for other senders.
//
// # Once per delivery
//
// The delivery ID is the key, in the ledger's states rather than by mere presence: a
// delivery whose handler failed is not recorded, so the sender's redelivery is processed;
// a completed one is acknowledged without running again; one still in flight answers
// 409 so the sender retries later. The handler gets the transaction, so the receipt
// and the work it hands on (a row in a jobs table, an outbox event) commit together, and
// the 2xx goes out right after: keep the handler short, as senders time out (GitHub
// after 10 seconds). A delivery is remembered for the ledger's retention of the
// operation "webhook.<Source>" (ledger.Config.OperationRetention); one redelivered
// after that is a new delivery, processed again.
//
// # Out of order
//
// Senders do not promise order. [Delivery.Newer] records the newest version applied per
// entity and reports whether this delivery's version is newer, so a handler can ignore
// an older event that arrives after a newer one. Its table comes with migrate.Up (or
// [Migrations]); [New] refuses a schema without it, with a [*SchemaError] that names the
// migration to run.
//
// # Unauthenticated senders cost little
//
// A body must be read whole before its signature can be checked, so until then a
// sender is anyone. The receiver bounds what such senders can take:
//
//   - Memory: a Content-Length over [Config].MaxBodyBytes (25 MiB) is refused with 413
//     before anything is read. A declared length is read into one buffer of that size;
//     a body without one (chunked) into small buffers up to 256 KiB, then one of
//     MaxBodyBytes, and is refused with 413 once it passes the limit. A delivery holds
//     one of [Config].MaxConcurrentReads read slots (4) from before its first byte is
//     read until its signature is checked, so unauthenticated bodies take at most
//     MaxConcurrentReads × MaxBodyBytes (100 MiB by default), plus under 512 KiB per
//     chunked read for the small buffers it outgrew. That bounds the bodies alive at
//     once; the buffers of refused bodies are garbage that the Go runtime collects when
//     the heap reaches its goal (GOGC: twice what is alive, by default), so under a
//     stream of oversized bodies the heap can reach about twice the bound (8 senders
//     against 4 slots of 8 MiB: 50–70 MiB). Set GOMEMLIMIT to hold the process to a
//     figure of your own.
//   - Time: a delivery waits up to [Config].ReadSlotWait (10 s) for a slot, then gets
//     503 with Retry-After; waiting deliveries take freed slots in the order they came.
//     A delivery holding a slot has [Config].BodyReadTimeout (5 s) to send its whole
//     body, or is answered 408 and its connection closed. So senders that stall after
//     their headers lose their slots, and a genuine delivery waiting for one gets it
//     within BodyReadTimeout once fewer deliveries wait ahead of it than there are
//     slots: stalled senders that come back after being cut queue behind it. Many
//     connections opened at once are a flood that no per-request bound stops: limit
//     connections per client in front of the receiver (a reverse proxy).
//
// Go's garbage collector lets the process's heap grow past what is live (to twice it
// with GOGC=100) before it collects; set GOMEMLIMIT to keep the heap near the bound.
//
// # Server timeouts
//
// The receiver bounds the body; the http.Server bounds the rest of the connection. Set:
//
//   - ReadHeaderTimeout, such as 5 s: a sender that sends its headers slowly holds a
//     connection and a goroutine, never a read slot, until this runs out.
//   - ReadTimeout: leave it zero, or above ReadHeaderTimeout + ReadSlotWait +
//     BodyReadTimeout. It covers the whole request from its first byte, and the
//     receiver replaces it with BodyReadTimeout for the body.
//   - WriteTimeout, above ReadSlotWait + BodyReadTimeout + [Config].Wait + the
//     handler's longest run: it is counted from the end of the request's headers, so it
//     covers the whole delivery, and a shorter one cuts the answer to a delivery that
//     was processed, and the sender redelivers it.
//   - IdleTimeout, such as 60 s, so idle keep-alive connections are closed;
//     MaxHeaderBytes, such as 64 KiB (the default is 1 MiB).
//
// For example:
//
//	srv := &http.Server{Addr: ":8443", Handler: receiver,
//		ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
//		IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}
//
// Behind a middleware, the receiver sets the body's deadline through
// http.ResponseController, which needs the middleware's ResponseWriter to unwrap to the
// server's (an Unwrap method); without it, only the server's timeouts bound the read.
package webhook

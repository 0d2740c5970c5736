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
// after 10 seconds).
//
// # Out of order
//
// Senders do not promise order. [Delivery.Newer] records the newest version applied per
// entity and reports whether this delivery's version is newer, so a handler can ignore
// an older event that arrives after a newer one.
package webhook

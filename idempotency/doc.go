// Package idempotency is HTTP middleware that makes a mutating request with an
// Idempotency-Key header take effect once, on the oncekit ledger.
//
// # Contract
//
// It follows the IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header). The draft expired without becoming an RFC,
// so the contract is spelled out here:
//
//   - The key is the header's value as a Structured Field string (a quoted string, such
//     as Idempotency-Key: "8e03978e-40d5"), one per request, of printable ASCII, 1 to 255
//     characters. A bare token is accepted too, for clients that do not quote.
//   - Requests with a method in [Config].Methods (POST and PATCH by default) must carry
//     the key: without it, 400. Safe methods pass through; other methods are guarded
//     when they carry a key.
//   - The key is scoped by the tenant ([Config].TenantFunc, for example the
//     authenticated client) and the operation (method and route pattern), so one
//     client's key never returns another client's stored response.
//   - The request is fingerprinted: method, route and body (JSON bodies in canonical
//     form). The same key with a different fingerprint: 422.
//   - While the first request with a key is in flight, a duplicate gets 409 with
//     Retry-After, or waits up to [Config].Wait and gets the first response.
//   - A completed request is replayed with the original status, the allow-listed headers
//     and the byte-equal body, plus "Idempotency-Replayed: true". 2xx and definitive
//     4xx responses are stored; a 5xx (and 408, 409, 425, 429) is not, and frees the key.
//   - Errors are RFC 9457 application/problem+json documents with stable type URIs,
//     the Problem* constants.
//
// # Writing in the same transaction
//
// The handler runs inside the ledger's transaction; [Tx] returns it from the request's
// context. Rows written through it commit together with the stored response, or not at
// all. The response reaches the client only after that commit, so a client never sees a
// success that was not recorded.
package idempotency

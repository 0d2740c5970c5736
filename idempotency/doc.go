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
//     the key: without it, 400. Other unsafe methods (PUT, DELETE) are guarded when they
//     carry a key. Safe methods (GET, HEAD, OPTIONS, TRACE) are never guarded, and
//     [New] refuses them in Config.Methods.
//   - The key is scoped by the tenant ([Config].TenantFunc, for example the
//     authenticated client) and the operation, "METHOD pattern" such as
//     "POST /orders/{id}/refund" ([Operation]), so one client's key never returns
//     another client's stored response.
//   - The request is fingerprinted: the method, the concrete path (/orders/2/refund,
//     not the pattern), the query (parameters sorted by name) and the body (JSON bodies
//     in canonical form). The same key with a different fingerprint, on another
//     resource included: 422, never a replay.
//   - While the first request with a key is in flight, a duplicate gets 409 with
//     Retry-After, or waits up to [Config].Wait and gets the first response.
//   - A completed request is replayed with the original status, the allow-listed headers
//     ([Config].ReplayHeaders) and the byte-equal body, plus "Idempotency-Replayed: true".
//     2xx, 3xx and definitive 4xx responses are stored; a 5xx (and 408, 409, 425, 429)
//     is not, and frees the key ([StoreDefault]).
//   - Errors are RFC 9457 application/problem+json documents with stable type URIs,
//     the Problem* constants.
//
// # Writing in the same transaction
//
// The handler runs inside the ledger's transaction; [Tx] returns it from the request's
// context. Rows written through it commit together with the stored response, or not at
// all. The response reaches the client only after that commit, so a client never sees a
// success that was not recorded.
//
// When one of the handler's statements fails (a unique violation it answers with 422,
// say), the transaction is aborted and none of its writes can commit. What the handler
// answers then decides what is stored, as the ledger decides for a definitive failure:
//
//   - a status [Config].StoreFunc stores, 400 or above: the writes are rolled back and
//     the answer (status, allow-listed headers, body) is stored as the record's
//     definitive failure, sent, and replayed byte for byte to every retry;
//   - a status StoreFunc does not store (409, 5xx): rolled back, sent, the key left
//     free, as without a failed statement;
//   - a success (2xx, 3xx): it is not true, since nothing committed. Nothing is stored,
//     the key is left free and the client gets 500 ([ProblemTxAborted]).
//
// A handler that wants some writes to survive a failed statement runs the statement
// in a savepoint of its own (tx.Begin), and rolls back to it.
//
// # Buffered responses
//
// The handler writes to a buffer, not to the connection: nothing reaches the client
// before the commit. So a guarded handler cannot stream. The ResponseWriter it gets
// implements http.ResponseWriter only: it is not an http.Flusher or an http.Hijacker,
// and http.ResponseController's Flush, Hijack, SetReadDeadline, SetWriteDeadline and
// EnableFullDuplex return http.ErrNotSupported. Leave streaming endpoints unguarded,
// or have them store a reference that a second request streams from.
//
// The buffer holds at most [Config].MaxResponseBytes (1 MiB by default, the ledger's
// stored body limit): the Write that would pass it returns [ErrResponseTooLarge], the
// buffer is dropped, the handler's writes are rolled back and the client gets 500
// ([ProblemResponseTooLarge]). The request body is read whole too, up to
// [Config].MaxBodyBytes, since it is fingerprinted before the handler runs.
//
// # Routes and telemetry
//
// The operation names a route, never a concrete path: it scopes keys, selects the
// retention (ledger.Config.OperationRetention) and is the oncekit.operation attribute
// of the ledger's metrics and spans, so one series per route, not one per resource.
// Wrap each route's handler inside a ServeMux (r.Pattern is then set), or wrap the
// ServeMux itself (the middleware asks it for the pattern it matches; a request it does
// not route passes through unguarded, to its 404, 405 or redirect). Behind any other
// router, set [Config].RouteFunc to the router's pattern; without it, every request is
// in one operation per method, "POST *" ([RouteUnknown]).
package idempotency

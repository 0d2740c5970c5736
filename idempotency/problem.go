package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem type URIs (RFC 9457): stable identifiers of the errors this middleware
// returns, each documented at its URI.
const (
	problemBase = "https://pkg.go.dev/github.com/oncekit/oncekit/idempotency#"
	// ProblemKeyMissing: 400, the method requires an Idempotency-Key and there is none.
	ProblemKeyMissing = problemBase + "ProblemKeyMissing"
	// ProblemKeyInvalid: 400, the key is malformed, too long, or given more than once.
	ProblemKeyInvalid = problemBase + "ProblemKeyInvalid"
	// ProblemBodyMalformed: 400, a JSON body that does not parse, so it cannot be
	// fingerprinted.
	ProblemBodyMalformed = problemBase + "ProblemBodyMalformed"
	// ProblemBodyTooDeep: 400, a JSON body nested deeper than keys.MaxJSONDepth.
	ProblemBodyTooDeep = problemBase + "ProblemBodyTooDeep"
	// ProblemNotStored: 500, the handler answered with a status below 400 that the
	// Config's StoreFunc does not store; its writes were rolled back.
	ProblemNotStored = problemBase + "ProblemNotStored"
	// ProblemBodyTooLarge: 413, the request body is over [Config].MaxBodyBytes.
	ProblemBodyTooLarge = problemBase + "ProblemBodyTooLarge"
	// ProblemKeyReused: 422, the key was used before with a different request.
	ProblemKeyReused = problemBase + "ProblemKeyReused"
	// ProblemInProgress: 409, the first request with this key is still being processed;
	// retry after Retry-After seconds.
	ProblemInProgress = problemBase + "ProblemInProgress"
	// ProblemTenant: 401, the request's tenant could not be established.
	ProblemTenant = problemBase + "ProblemTenant"
	// ProblemUnavailable: 503, the ledger could not be reached; retry with the same key.
	// Also 500 with the title "Corrupt stored response" when a stored response cannot
	// be read back.
	ProblemUnavailable = problemBase + "ProblemUnavailable"
	// ProblemResponseTooLarge: 500, the handler's response is over [Config].MaxResponseBytes
	// or the ledger's stored body limit; the request was rolled back.
	ProblemResponseTooLarge = problemBase + "ProblemResponseTooLarge"
	// ProblemTxAborted: 500, the handler answered a success (2xx or 3xx) although one of
	// its statements failed, so none of its writes could commit; nothing was stored and
	// the key is free.
	ProblemTxAborted = problemBase + "ProblemTxAborted"
	// ProblemOutcomeUnknown: 503, the request's commit was sent and its answer lost
	// (the connection broke, the server shut down): its effect may have committed.
	// Nothing is known to be rolled back; retry with the same key, which returns the
	// stored response if it committed and runs the request if it did not.
	ProblemOutcomeUnknown = problemBase + "ProblemOutcomeUnknown"
)

// problem is an RFC 9457 problem details document.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, typ, title, detail string, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{Type: typ, Title: title, Status: status, Detail: detail})
}

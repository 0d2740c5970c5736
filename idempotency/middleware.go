package idempotency

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/internal/pipetx"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Defaults of [Config].
const (
	// HeaderDefault is the request header that carries the key.
	HeaderDefault = "Idempotency-Key"
	// ReplayedHeaderDefault marks a replayed response.
	ReplayedHeaderDefault = "Idempotency-Replayed"
	// MaxBodyDefault is the largest request body read, in bytes.
	MaxBodyDefault = 1 << 20
	// MaxResponseDefault is the largest response buffered and stored, in bytes, in the
	// stored form (the allow-listed headers, then the body): the ledger's default limit
	// on a stored body, ledger.MaxBodyDefault.
	MaxResponseDefault = ledger.MaxBodyDefault
	// RouteUnknown is the route of a request whose route pattern the middleware cannot
	// learn: no ServeMux matched it before the middleware and the middleware does not
	// wrap one, and [Config].RouteFunc is not set. Such requests share one operation per
	// method, "POST *", so that the concrete path, which the fingerprint covers, never
	// becomes a scope, a metric attribute or a span attribute.
	RouteUnknown = "*"
)

// ErrResponseTooLarge is what a guarded handler's Write returns once the stored response
// would pass [Config].MaxResponseBytes. Nothing of the response is sent or stored: the
// client gets 500 ([ProblemResponseTooLarge]) and the handler's writes roll back, so the
// handler may stop writing at once.
var ErrResponseTooLarge = errors.New("oncekit/idempotency: the response is over Config.MaxResponseBytes and will be neither sent nor stored: answer with less (a reference to a large result), or raise the limit")

// MethodsDefault are the methods that require a key.
func MethodsDefault() []string { return []string{http.MethodPost, http.MethodPatch} }

// safeMethod reports whether m is safe (RFC 9110, 9.2.1): it asks for no effect, so the
// middleware never guards it.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace
}

// ReplayHeadersDefault are the response headers stored and replayed: the
// representation headers a client needs to read the body as it was first sent, and
// Location. Cache-Control is not among them: it governs how long the first response
// may be reused by caches, and replayed later it would restart that time from the
// replay; add it to Config.ReplayHeaders to replay it anyway. Set-Cookie is never
// stored, whatever the configuration says.
func ReplayHeadersDefault() []string {
	return []string{"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified"}
}

// Config configures [New].
type Config struct {
	// Ledger stores the keys and responses. Required.
	Ledger *ledger.Ledger
	// TenantFunc returns the tenant a request belongs to, such as the authenticated
	// client's ID; an error answers 401. Any non-empty tenant is accepted: one that is
	// not a valid scope part (non-ASCII, over 128 bytes) is mapped by keys.ScopePart.
	// Required: use [FixedTenant] for a single tenant.
	TenantFunc func(*http.Request) (string, error)
	// RouteFunc returns the route a request matched, which with the method names the
	// operation: "METHOD route", such as "POST /orders/{id}/refund" (a method at the
	// start of the route is not repeated). Records are kept per operation, so
	// ledger.Config.OperationRetention takes that name, and the ledger's metrics and
	// spans carry it as oncekit.operation. It must be a route pattern or a fixed name,
	// never the concrete path, which would make one series per resource (the
	// fingerprint covers the concrete path anyway). The route is derived, never refused:
	// a value that is not a valid scope part is mapped by keys.ScopePart. Set it for a
	// router other than ServeMux, for example from chi.RouteContext(r).RoutePattern().
	// Defaults to the ServeMux pattern: r.Pattern when the middleware wraps a route's
	// handler; the pattern the mux matches when it wraps a *http.ServeMux (a request
	// the mux does not route, which it answers 404, 405 or with a redirect, passes
	// through unguarded); else [RouteUnknown].
	RouteFunc func(*http.Request) string
	// Header is the request header carrying the key. Defaults to [HeaderDefault].
	Header string
	// Methods lists the methods whose requests must carry a key: without one, 400. A
	// request with another unsafe method (PUT, DELETE) is guarded when it carries a key.
	// Safe methods (GET, HEAD, OPTIONS, TRACE) ask for no effect and are never guarded,
	// so New refuses them here. Defaults to [MethodsDefault].
	Methods []string
	// MaxBodyBytes bounds the request body; a larger one answers 413. Defaults to
	// [MaxBodyDefault].
	MaxBodyBytes int64
	// MaxResponseBytes bounds the response the middleware buffers until the ledger's
	// transaction ends, in the stored form: the allow-listed headers, encoded, then the
	// body. A handler's Write that would pass it fails with [ErrResponseTooLarge]; the
	// buffer is dropped, the handler's writes roll back and the client gets 500
	// ([ProblemResponseTooLarge]). The buffer grows by doubling up to the limit, so a
	// response costs at most the limit once written, and under twice the limit in
	// allocations while it grows. Keep it at most ledger.Config.MaxBodyBytes, which the
	// ledger enforces on what it stores. Defaults to [MaxResponseDefault].
	MaxResponseBytes int
	// Wait is how long a duplicate of an in-flight request waits for it before it gets
	// 409. Defaults to not waiting (409 at once), as does ledger.NoWait.
	Wait time.Duration
	// StoreFunc decides which final statuses are stored and replayed; a status it
	// refuses rolls the handler's writes back and frees the key. A refused status below
	// 400 would tell the client the request took effect, so the client gets a 500
	// problem ([ProblemNotStored]) instead. Defaults to [StoreDefault].
	StoreFunc func(status int) bool
	// ReplayHeaders are the response headers stored and replayed. Defaults to
	// [ReplayHeadersDefault].
	ReplayHeaders []string
	// ReplayedHeader marks replayed responses. Defaults to [ReplayedHeaderDefault].
	ReplayedHeader string
}

// StoreDefault stores 2xx, 3xx (a redirect after a write, as in Post/Redirect/Get) and
// the definitive 4xx statuses: every 4xx except 408, 409, 425 and 429, which ask the
// client to try again. 5xx is not stored, unlike some payment APIs: the handler's
// writes are rolled back and the key is free, so a retry runs the request again.
func StoreDefault(status int) bool {
	switch {
	case status >= 200 && status < 400:
		return true
	case status >= 400 && status < 500:
		return status != http.StatusRequestTimeout && status != http.StatusConflict &&
			status != http.StatusTooEarly && status != http.StatusTooManyRequests
	}
	return false
}

// FixedTenant returns a TenantFunc for a single-tenant service.
func FixedTenant(tenant string) func(*http.Request) (string, error) {
	return func(*http.Request) (string, error) { return tenant, nil }
}

type txKey struct{}

// Tx returns the ledger's transaction from the context of a request the middleware
// guards. Write through it so the writes commit with the stored response.
func Tx(r *http.Request) (pgx.Tx, bool) {
	tx, ok := r.Context().Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// New returns the middleware.
func New(cfg *Config) (func(http.Handler) http.Handler, error) {
	if cfg == nil || cfg.Ledger == nil || cfg.TenantFunc == nil {
		return nil, errors.New("oncekit/idempotency: Config needs a Ledger and a TenantFunc")
	}
	c := *cfg
	if c.Header == "" {
		c.Header = HeaderDefault
	}
	if c.Methods == nil {
		c.Methods = MethodsDefault()
	}
	for _, m := range c.Methods {
		if safeMethod(m) {
			return nil, fmt.Errorf("oncekit/idempotency: Config.Methods lists %s, a safe method, which the middleware never guards: remove it", m)
		}
	}
	c.MaxBodyBytes = config.Or(c.MaxBodyBytes, MaxBodyDefault)
	c.MaxResponseBytes = config.Or(c.MaxResponseBytes, MaxResponseDefault)
	if c.MaxBodyBytes < 0 || c.MaxResponseBytes < 0 {
		return nil, errors.New("oncekit/idempotency: Config.MaxBodyBytes and MaxResponseBytes must not be negative; zero means the default")
	}
	if c.StoreFunc == nil {
		c.StoreFunc = StoreDefault
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = ReplayHeadersDefault()
	}
	replay := make([]string, 0, len(c.ReplayHeaders))
	for _, h := range c.ReplayHeaders {
		if h = http.CanonicalHeaderKey(h); h != "Set-Cookie" && !slices.Contains(replay, h) {
			replay = append(replay, h)
		}
	}
	c.ReplayHeaders = replay
	if c.ReplayedHeader == "" {
		c.ReplayedHeader = ReplayedHeaderDefault
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, next) })
	}, nil
}

// errNotStored carries a response the middleware must not store out of the ledger call,
// which rolls back.
type errNotStored struct{ rec *recorder }

func (errNotStored) Error() string { return "oncekit/idempotency: response not stored" }

// errSuccessNotCommitted carries a success-looking response whose writes cannot commit,
// because one of the handler's statements failed, out of the ledger call, which rolls
// back.
type errSuccessNotCommitted struct{ rec *recorder }

func (errSuccessNotCommitted) Error() string {
	return "oncekit/idempotency: the handler answered a success after one of its statements failed"
}

// redirectType is the type of the handler a ServeMux returns for a request it redirects.
var redirectType = reflect.TypeOf(http.RedirectHandler("/", http.StatusTemporaryRedirect))

// route returns the route of r, and false when r is for a wrapped ServeMux that routes it
// to no handler of its own (it answers 404 or 405, or redirects), so that nothing runs
// that needs guarding.
func (c *Config) route(r *http.Request, next http.Handler) (string, bool) {
	switch {
	case c.RouteFunc != nil:
		return c.RouteFunc(r), true
	case r.Pattern != "":
		return r.Pattern, true
	}
	if mux, ok := next.(*http.ServeMux); ok && r.Method != http.MethodConnect {
		h, pattern := mux.Handler(r)
		if pattern == "" || reflect.TypeOf(h) == redirectType {
			return "", false
		}
		return pattern, true
	}
	return RouteUnknown, true
}

func (c *Config) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(c.Header)
	required := slices.Contains(c.Methods, r.Method)
	if safeMethod(r.Method) || (!required && len(values) == 0) {
		next.ServeHTTP(w, r)
		return
	}
	route, guarded := c.route(r, next)
	if !guarded {
		next.ServeHTTP(w, r)
		return
	}
	raw, err := ParseKey(values)
	if errors.Is(err, ErrKeyMissing) {
		writeProblem(w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency-Key required",
			fmt.Sprintf("%s requests to this endpoint need an %s header naming the intent, for example a UUID", r.Method, c.Header), 0)
		return
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "Invalid Idempotency-Key", err.Error(), 0)
		return
	}
	key, err := keys.New(raw)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "Invalid Idempotency-Key", err.Error(), 0)
		return
	}
	tenant, err := c.TenantFunc(r)
	if err == nil && tenant == "" {
		err = errors.New("no tenant")
	}
	if err != nil {
		writeProblem(w, http.StatusUnauthorized, ProblemTenant, "Unknown client", err.Error(), 0)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("the body is over %d bytes", c.MaxBodyBytes), 0)
		return
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBodyMalformed, "Unreadable request body", err.Error(), 0)
		return
	}
	fp, err := fingerprint(r, body)
	if errors.Is(err, keys.ErrJSONTooDeep) {
		writeProblem(w, http.StatusBadRequest, ProblemBodyTooDeep, "JSON body nested too deeply",
			fmt.Sprintf("the body nests arrays and objects deeper than %d levels", keys.MaxJSONDepth), 0)
		return
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBodyMalformed, "Malformed JSON body", err.Error(), 0)
		return
	}
	in := ledger.Intent{Scope: keys.Scope{Tenant: keys.ScopePart(tenant), Operation: Operation(r, route)}, Key: key, Fingerprint: fp}
	var answered *recorder // the handler's own response, when it ran and its outcome is to be stored
	res, err := c.Ledger.Do(r.Context(), in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		rec := newRecorder(c.MaxResponseBytes, c.ReplayHeaders)
		req := r.WithContext(context.WithValue(ctx, txKey{}, tx))
		req.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(rec, req)
		rec.finish()
		switch {
		case rec.tooLarge:
			return ledger.Response{}, ErrResponseTooLarge
		case !c.StoreFunc(rec.status):
			return ledger.Response{}, errNotStored{rec}
		case statementFailed(tx):
			// None of the handler's writes can commit. A definitive answer is stored
			// without them, as the ledger stores a definitive failure; a success is not
			// true, and is not sent.
			if rec.status < 400 {
				return ledger.Response{}, errSuccessNotCommitted{rec}
			}
			answered = rec
			return ledger.Response{}, &ledger.DefinitiveError{Code: failureCode(rec.status), Message: http.StatusText(rec.status),
				Response: &ledger.Response{Code: rec.status, Body: rec.buf}}
		}
		answered = rec
		return ledger.Response{Code: rec.status, Body: rec.buf}, nil
	}, &ledger.DoOpts{Wait: c.Wait, Mode: ledger.ModeClaimFirst})
	var ns errNotStored
	var snc errSuccessNotCommitted
	var derr *ledger.DefinitiveError
	var mm *ledger.FingerprintMismatchError
	var tl *ledger.BodyTooLargeError
	switch {
	case err == nil && !res.Replayed && answered != nil:
		answered.writeTo(w) // committed: now the client may see it
	case err == nil:
		c.replay(w, res.Code, res.Body, res.Replayed)
	case errors.As(err, &derr) && !derr.Replayed && answered != nil:
		answered.writeTo(w) // the failure is committed
	case errors.As(err, &derr) && derr.Response != nil:
		c.replay(w, derr.Response.Code, derr.Response.Body, derr.Replayed)
	case errors.As(err, &derr):
		// A failure stored before failures had a response of their own: its body is
		// base64 in the message.
		status, ok := failureStatus(derr.Code)
		stored, decodeErr := base64.StdEncoding.DecodeString(derr.Message)
		if !ok || decodeErr != nil {
			writeProblem(w, http.StatusInternalServerError, ProblemUnavailable, "Corrupt stored response", "", 0)
			return
		}
		c.replay(w, status, stored, derr.Replayed)
	case errors.As(err, &ns) && ns.rec.status < 400:
		// Rolled back: a success-looking answer would claim an effect that is not there.
		writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Response not stored",
			fmt.Sprintf("the handler answered %d, which is not stored, so its writes were rolled back; retry with the same key", ns.rec.status), 0)
	case errors.As(err, &ns):
		ns.rec.writeTo(w)
	case errors.As(err, &snc) || errors.Is(err, ledger.ErrTxAborted):
		writeProblem(w, http.StatusInternalServerError, ProblemTxAborted, "Handler's writes not committed",
			"the handler answered a success although one of its statements failed, so none of its writes could commit; nothing was stored: retry with the same key", 0)
	case errors.As(err, &mm):
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency-Key reused",
			fmt.Sprintf("the key %q was first used at %s with a different request; send a new key for a new request",
				string(key), mm.StoredAt.UTC().Format(time.RFC3339)), 0)
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		writeProblem(w, http.StatusServiceUnavailable, ProblemOutcomeUnknown, "Outcome unknown",
			"the request's commit was sent and its answer was lost, so it may have taken effect; retry it with the same key, which returns its response if it did", 1)
	case errors.Is(err, ledger.ErrInProgress):
		writeProblem(w, http.StatusConflict, ProblemInProgress, "Request in progress",
			"a request with this key is being processed; retry it with the same key", 1)
	case errors.Is(err, ErrResponseTooLarge):
		writeProblem(w, http.StatusInternalServerError, ProblemResponseTooLarge, "Response too large to store",
			fmt.Sprintf("the handler's response is over %d bytes; its writes were rolled back", c.MaxResponseBytes), 0)
	case errors.As(err, &tl):
		writeProblem(w, http.StatusInternalServerError, ProblemResponseTooLarge, "Response too large to store",
			"the request was rolled back: "+tl.Error(), 0)
	default:
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Idempotency store unavailable",
			"the request was not processed; retry it with the same key", 1)
	}
}

// statementFailed reports whether one of the handler's statements failed and left tx
// aborted, so that none of its writes can commit.
func statementFailed(tx pgx.Tx) bool {
	if p, ok := tx.(*pipetx.Tx); ok && !p.Sent() {
		// Nothing was sent, so nothing failed; asking the connection would send the
		// ledger's claim in a round trip of its own.
		return false
	}
	return tx.Conn().PgConn().TxStatus() == 'E'
}

// failurePrefix begins the code of a stored failure: "http_422". The failure's response
// (see [recorder]) is stored with it; a failure stored before failures had one kept it in
// base64 in the message, and still replays.
const failurePrefix = "http_"

func failureCode(status int) string { return failurePrefix + strconv.Itoa(status) }

func failureStatus(code string) (int, bool) {
	s, ok := strings.CutPrefix(code, failurePrefix)
	if !ok {
		return 0, false
	}
	status, err := strconv.Atoi(s)
	return status, err == nil && status >= 100 && status <= 999
}

// Operation names the operation of a request: "METHOD route", the method said once
// even when the route (a ServeMux pattern such as "POST /orders") begins with it, and
// mapped by keys.ScopePart when it is not a valid scope part. A method that RFC 9110
// and RFC 5789 do not define is named [MethodOther], as OpenTelemetry names it, so that
// a client cannot make one series per method it makes up; the fingerprint still covers
// the method itself.
func Operation(r *http.Request, route string) string {
	method := r.Method
	if !knownMethod(method) {
		method = MethodOther
	}
	if m, rest, ok := strings.Cut(route, " "); ok && m == method {
		route = strings.TrimLeft(rest, " ")
	}
	return keys.ScopePart(method + " " + route)
}

// MethodOther stands for every request method that HTTP does not define, in an
// operation's name.
const MethodOther = "_OTHER"

// knownMethod reports whether m is a method RFC 9110 or RFC 5789 (PATCH) defines.
func knownMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// fingerprint covers everything that makes a request different: the method, the
// concrete path, the query (parameters sorted by name, so their order does not matter)
// and the body, a JSON body in canonical form. The same key on another target is a
// conflict, never a replay.
func fingerprint(r *http.Request, body []byte) (keys.Fingerprint, error) {
	canon := body
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" || strings.HasSuffix(mt, "+json") {
		if len(bytes.TrimSpace(body)) > 0 {
			var err error
			if canon, err = keys.CanonicalJSON(body); err != nil {
				return "", err
			}
		}
	}
	query := r.URL.RawQuery
	if v, err := url.ParseQuery(query); err == nil {
		query = v.Encode()
	}
	var b bytes.Buffer
	for _, part := range [][]byte{[]byte(r.Method), []byte(r.URL.EscapedPath()), []byte(query), canon} {
		_ = binary.Write(&b, binary.BigEndian, uint64(len(part)))
		b.Write(part)
	}
	return keys.FingerprintBytes(b.Bytes()), nil
}

// replay writes a stored response: status, the stored headers and the body, marked as
// replayed when it was read from the ledger.
func (c *Config) replay(w http.ResponseWriter, status int, stored []byte, replayed bool) {
	h, body, ok := decodeStored(stored)
	if !ok {
		writeProblem(w, http.StatusInternalServerError, ProblemUnavailable, "Corrupt stored response", "", 0)
		return
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	if replayed {
		w.Header().Set(c.ReplayedHeader, "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

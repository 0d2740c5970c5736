package idempotency

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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
)

// MethodsDefault are the methods that require a key.
func MethodsDefault() []string { return []string{http.MethodPost, http.MethodPatch} }

// ReplayHeadersDefault are the response headers stored and replayed: the
// representation headers a client needs to read the body as it was first sent, and
// Location. Set-Cookie is never stored, whatever the configuration says.
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
	// ledger.Config.OperationRetention takes that name. The route is derived, never
	// refused: a value that is not a valid scope part is mapped by keys.ScopePart.
	// Defaults to the ServeMux pattern (r.Pattern) when the middleware wraps a route's
	// handler, else the URL path.
	RouteFunc func(*http.Request) string
	// Header is the request header carrying the key. Defaults to [HeaderDefault].
	Header string
	// Methods require a key. Defaults to [MethodsDefault].
	Methods []string
	// MaxBodyBytes bounds the request body; a larger one answers 413. Defaults to
	// [MaxBodyDefault].
	MaxBodyBytes int64
	// Wait is how long a duplicate of an in-flight request waits for it before it gets
	// 409. Defaults to not waiting (409 at once), as does ledger.NoWait.
	Wait time.Duration
	// StoreFunc decides which final statuses are stored and replayed; a status it
	// refuses rolls the handler's writes back and frees the key. A refused status below
	// 400 would tell the client the request took effect, so the client gets a 500
	// problem (ProblemNotStored) instead. Defaults to [StoreDefault].
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
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyDefault
	}
	if c.StoreFunc == nil {
		c.StoreFunc = StoreDefault
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = ReplayHeadersDefault()
	}
	c.ReplayHeaders = slices.DeleteFunc(slices.Clone(c.ReplayHeaders), func(h string) bool {
		return http.CanonicalHeaderKey(h) == "Set-Cookie"
	})
	if c.ReplayedHeader == "" {
		c.ReplayedHeader = ReplayedHeaderDefault
	}
	if c.RouteFunc == nil {
		c.RouteFunc = func(r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return r.URL.Path
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, next) })
	}, nil
}

// errNotStored carries a response the middleware must not store out of the ledger call,
// which rolls back.
type errNotStored struct{ rec *recorder }

func (errNotStored) Error() string { return "oncekit/idempotency: response not stored" }

func (c *Config) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(c.Header)
	required := slices.Contains(c.Methods, r.Method)
	safe := r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions || r.Method == http.MethodTrace
	if safe || (!required && len(values) == 0) {
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
	in := ledger.Intent{Scope: keys.Scope{Tenant: keys.ScopePart(tenant), Operation: Operation(r, c.RouteFunc(r))}, Key: key, Fingerprint: fp}
	var first *recorder // the handler's own response, when it ran and was stored
	res, err := c.Ledger.Do(r.Context(), in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		rec := newRecorder()
		req := r.WithContext(context.WithValue(ctx, txKey{}, tx))
		req.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(rec, req)
		if !c.StoreFunc(rec.status) {
			return ledger.Response{}, errNotStored{rec}
		}
		first = rec
		return ledger.Response{Code: rec.status, Body: c.encode(rec)}, nil
	}, &ledger.DoOpts{Wait: c.Wait, Mode: ledger.ModeClaimFirst})
	var ns errNotStored
	var mm *ledger.FingerprintMismatchError
	var tl *ledger.BodyTooLargeError
	switch {
	case err == nil && !res.Replayed && first != nil:
		first.writeTo(w) // committed: now the client may see it
	case err == nil:
		c.replay(w, res)
	case errors.As(err, &ns) && ns.rec.status < 400:
		// Rolled back: a success-looking answer would claim an effect that is not there.
		writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Response not stored",
			fmt.Sprintf("the handler answered %d, which is not stored, so its writes were rolled back; retry with the same key", ns.rec.status), 0)
	case errors.As(err, &ns):
		ns.rec.writeTo(w)
	case errors.As(err, &mm):
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency-Key reused",
			fmt.Sprintf("the key %q was first used at %s with a different request; send a new key for a new request",
				string(key), mm.StoredAt.UTC().Format(time.RFC3339)), 0)
	case errors.Is(err, ledger.ErrInProgress):
		writeProblem(w, http.StatusConflict, ProblemInProgress, "Request in progress",
			"a request with this key is being processed; retry it with the same key", 1)
	case errors.As(err, &tl):
		writeProblem(w, http.StatusInternalServerError, ProblemResponseTooLarge, "Response too large to store",
			"the request was rolled back: "+tl.Error(), 0)
	default:
		writeProblem(w, http.StatusServiceUnavailable, ProblemUnavailable, "Idempotency store unavailable",
			"the request was not processed; retry it with the same key", 1)
	}
}

// Operation names the operation of a request: "METHOD route", the method said once
// even when the route (a ServeMux pattern such as "POST /orders") begins with it, and
// mapped by keys.ScopePart when it is not a valid scope part.
func Operation(r *http.Request, route string) string {
	if m, rest, ok := strings.Cut(route, " "); ok && m == r.Method {
		route = strings.TrimLeft(rest, " ")
	}
	return keys.ScopePart(r.Method + " " + route)
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

// encode stores the allow-listed headers and the body: a length-prefixed JSON header
// map, then the body bytes unchanged.
func (c *Config) encode(rec *recorder) []byte {
	h := map[string][]string{}
	for _, name := range c.ReplayHeaders {
		if v := rec.header.Values(name); len(v) > 0 {
			h[http.CanonicalHeaderKey(name)] = v
		}
	}
	hj, _ := json.Marshal(h)
	out := make([]byte, 4, 4+len(hj)+rec.body.Len())
	binary.BigEndian.PutUint32(out, uint32(len(hj)))
	out = append(out, hj...)
	return append(out, rec.body.Bytes()...)
}

func (c *Config) replay(w http.ResponseWriter, res ledger.Result) {
	stored := res.Body
	if len(stored) < 4 {
		writeProblem(w, http.StatusInternalServerError, ProblemUnavailable, "Corrupt stored response", "", 0)
		return
	}
	n := binary.BigEndian.Uint32(stored)
	var h map[string][]string
	if int(n) > len(stored)-4 || json.Unmarshal(stored[4:4+n], &h) != nil {
		writeProblem(w, http.StatusInternalServerError, ProblemUnavailable, "Corrupt stored response", "", 0)
		return
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	if res.Replayed {
		w.Header().Set(c.ReplayedHeader, "true")
	}
	w.WriteHeader(res.Code)
	_, _ = w.Write(stored[4+n:])
}

// recorder buffers a handler's response until its transaction commits.
type recorder struct {
	header http.Header
	body   bytes.Buffer
	status int
	wrote  bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the final status; 1xx informational responses (103 Early Hints)
// are not final and are dropped, as nothing reaches the client before the commit.
func (r *recorder) WriteHeader(status int) {
	if status >= 100 && status < 200 {
		return
	}
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}

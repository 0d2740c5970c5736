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

// ReplayHeadersDefault are the response headers stored and replayed.
func ReplayHeadersDefault() []string {
	return []string{"Content-Type", "Content-Language", "Location", "ETag", "Last-Modified", "Cache-Control"}
}

// Config configures [New].
type Config struct {
	// Ledger stores the keys and responses. Required.
	Ledger *ledger.Ledger
	// TenantFunc returns the tenant a request belongs to, such as the authenticated
	// client's ID; an error answers 401. Required: use [FixedTenant] for a single tenant.
	TenantFunc func(*http.Request) (string, error)
	// RouteFunc returns the route a request matched, which with the method names the
	// operation. Defaults to the ServeMux pattern (r.Pattern) when the middleware wraps a
	// route's handler, else the URL path.
	RouteFunc func(*http.Request) string
	// Header is the request header carrying the key. Defaults to [HeaderDefault].
	Header string
	// Methods require a key. Defaults to [MethodsDefault].
	Methods []string
	// MaxBodyBytes bounds the request body; a larger one answers 413. Defaults to
	// [MaxBodyDefault].
	MaxBodyBytes int64
	// Wait is how long a duplicate of an in-flight request waits for it before it gets
	// 409. Defaults to 0: answer 409 at once.
	Wait time.Duration
	// StoreFunc decides which statuses are stored and replayed; a status it refuses
	// rolls the handler's writes back and frees the key. Defaults to [StoreDefault].
	StoreFunc func(status int) bool
	// ReplayHeaders are the response headers stored and replayed. Defaults to
	// [ReplayHeadersDefault].
	ReplayHeaders []string
	// ReplayedHeader marks replayed responses. Defaults to [ReplayedHeaderDefault].
	ReplayedHeader string
}

// StoreDefault stores 2xx and the definitive 4xx statuses: every 4xx except 408, 409,
// 425 and 429, which ask the client to try again.
func StoreDefault(status int) bool {
	switch {
	case status >= 200 && status < 300:
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
	route := c.RouteFunc(r)
	fp, err := fingerprint(r.Method, route, r.Header.Get("Content-Type"), body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemBodyMalformed, "Malformed JSON body", err.Error(), 0)
		return
	}
	in := ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: r.Method + " " + route}, Key: key, Fingerprint: fp}
	if err := in.Scope.Validate(); err != nil {
		writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "Invalid tenant or route", err.Error(), 0)
		return
	}
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
	}, &ledger.DoOpts{Wait: c.Wait})
	var ns errNotStored
	var mm *ledger.FingerprintMismatchError
	var tl *ledger.BodyTooLargeError
	switch {
	case err == nil && !res.Replayed && first != nil:
		first.writeTo(w) // committed: now the client may see it
	case err == nil:
		c.replay(w, res)
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

// fingerprint covers the method, the route and the body, a JSON body in canonical form.
func fingerprint(method, route, contentType string, body []byte) (keys.Fingerprint, error) {
	canon := body
	if mt, _, _ := mime.ParseMediaType(contentType); mt == "application/json" || strings.HasSuffix(mt, "+json") {
		if len(bytes.TrimSpace(body)) > 0 {
			var err error
			if canon, err = keys.CanonicalJSON(body); err != nil {
				return "", err
			}
		}
	}
	var b bytes.Buffer
	for _, part := range [][]byte{[]byte(method), []byte(route), canon} {
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

func (r *recorder) WriteHeader(status int) {
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

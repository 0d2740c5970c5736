package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// MaxBodyDefault is the largest delivery read, in bytes (GitHub caps payloads at 25 MB).
const MaxBodyDefault = 25 << 20

// Delivery is one authentic webhook delivery.
type Delivery struct {
	// ID is the sender's delivery ID.
	ID string
	// Event is the event type, when the sender names it.
	Event string
	// Header and Body are the request's, the body as received.
	Header http.Header
	Body   []byte

	tx     pgx.Tx
	ledger *ledger.Ledger
	scope  keys.Scope
}

// Newer records version as the newest applied version of entity, in this delivery's
// transaction, and reports whether it is newer than any applied before. Ignore the
// delivery's change to entity when it reports false: a newer event came first.
func (d Delivery) Newer(ctx context.Context, entity string, version int64) (bool, error) {
	return d.ledger.AdvanceVersionTx(ctx, d.tx, d.scope, entity, version)
}

// HandlerFunc processes a delivery inside the ledger's transaction tx. Return nil to
// acknowledge it; ledger.Definitive(code, msg) to acknowledge it as refused (stored, and
// never processed again); any other error to answer 500 so the sender redelivers.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Config configures [New].
type Config struct {
	// Ledger records deliveries. Required.
	Ledger *ledger.Ledger
	// Verifier authenticates deliveries. Required.
	Verifier Verifier
	// Handle processes a delivery. Required.
	Handle HandlerFunc
	// Source names the sender, such as "github"; with Tenant it scopes delivery IDs.
	// Required.
	Source string
	// Tenant owns the deliveries. Defaults to Source.
	Tenant string
	// MaxBodyBytes bounds the body read. Defaults to [MaxBodyDefault].
	MaxBodyBytes int64
	// Wait is how long a redelivery waits for the same delivery still in flight before
	// answering 409. Defaults to 0.
	Wait time.Duration
}

// Status values of the receiver's JSON answer.
const (
	StatusProcessed = "processed" // the handler ran and committed
	StatusDuplicate = "duplicate" // processed before; nothing ran
	StatusRefused   = "refused"   // the handler refused it definitively
)

// New returns the webhook endpoint.
func New(cfg *Config) (http.Handler, error) {
	if cfg == nil || cfg.Ledger == nil || cfg.Verifier == nil || cfg.Handle == nil || cfg.Source == "" {
		return nil, errors.New("oncekit/webhook: Config needs Ledger, Verifier, Handle and Source")
	}
	c := *cfg
	if c.Tenant == "" {
		c.Tenant = c.Source
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyDefault
	}
	scope := keys.Scope{Tenant: c.Tenant, Operation: "webhook." + c.Source}
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, scope) }), nil
}

func (c *Config) serve(w http.ResponseWriter, r *http.Request, scope keys.Scope) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		answer(w, http.StatusMethodNotAllowed, "error", "webhooks are POSTed")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.MaxBodyBytes))
	if err != nil {
		answer(w, http.StatusRequestEntityTooLarge, "error", "body unreadable or over the limit")
		return
	}
	v, err := c.Verifier.Verify(r.Header, body)
	if err != nil {
		answer(w, http.StatusUnauthorized, "error", err.Error())
		return
	}
	key, err := keys.New(v.ID)
	if err != nil {
		answer(w, http.StatusBadRequest, "error", "delivery ID: "+err.Error())
		return
	}
	in := ledger.Intent{Scope: scope, Key: key, Fingerprint: keys.FingerprintBytes(body)}
	res, err := c.Ledger.Do(r.Context(), in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		d := Delivery{ID: v.ID, Event: v.Event, Header: r.Header, Body: body, tx: tx, ledger: c.Ledger, scope: scope}
		if err := c.Handle(ctx, tx, d); err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{Code: http.StatusOK}, nil
	}, &ledger.DoOpts{Wait: c.Wait})
	var derr *ledger.DefinitiveError
	switch {
	case err == nil && res.Replayed:
		answer(w, http.StatusOK, StatusDuplicate, v.ID)
	case err == nil:
		answer(w, http.StatusOK, StatusProcessed, v.ID)
	case errors.As(err, &derr):
		answer(w, http.StatusOK, StatusRefused, derr.Error())
	case errors.Is(err, ledger.ErrFingerprintMismatch):
		answer(w, http.StatusUnprocessableEntity, "error", "delivery "+v.ID+" was received before with a different body")
	case errors.Is(err, ledger.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		answer(w, http.StatusConflict, "error", "delivery "+v.ID+" is being processed")
	default:
		answer(w, http.StatusInternalServerError, "error", "the delivery was not processed; redeliver it")
	}
}

func answer(w http.ResponseWriter, status int, state, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": state, "detail": detail})
}

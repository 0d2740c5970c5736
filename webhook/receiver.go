package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

// Defaults of [Config], and the receiver's migration line.
const (
	// MigrationLine names the receiver's line in the oncekit_migrations table.
	MigrationLine = "webhook"
	// MaxBodyDefault is the largest delivery read, in bytes (GitHub caps payloads at 25 MB).
	MaxBodyDefault = 25 << 20
	// MaxConcurrentReadsDefault is how many deliveries are read at once before their
	// signatures are checked.
	MaxConcurrentReadsDefault = 4
	// ReadSlotWaitDefault is how long a delivery waits for a read slot before it is
	// answered 503 with Retry-After.
	ReadSlotWaitDefault = 10 * time.Second
	// BodyReadTimeoutDefault is how long a delivery that holds a read slot has to send
	// its body. It is below ReadSlotWaitDefault, so a delivery waiting for a slot gets
	// one while it waits, whatever the senders holding the slots do.
	BodyReadTimeoutDefault = 5 * time.Second
)

// A body sent without Content-Length is read into a buffer that starts at
// smallBodyStart and doubles up to smallBodyMax; past that, into one buffer of
// MaxBodyBytes. A small delivery costs little, and no read holds more than MaxBodyBytes
// plus the small buffers it outgrew (under 2 × smallBodyMax in all), where doubling all
// the way would hold up to twice the limit.
const (
	smallBodyStart = 16 << 10
	smallBodyMax   = 256 << 10
)

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
	return advanceVersion(ctx, d.tx, d.ledger.Schema(), d.scope, entity, version)
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
	// MaxBodyBytes bounds the body read: a Content-Length over it is refused with 413
	// before anything is read, and a body without one is refused with 413 once it passes
	// the limit. Defaults to [MaxBodyDefault].
	MaxBodyBytes int64
	// MaxConcurrentReads bounds how many unauthenticated bodies are in memory at once. A
	// body must be read whole before its signature can be checked, so a delivery holds a
	// read slot from before its first byte is read until its signature is checked: at
	// most MaxConcurrentReads × MaxBodyBytes, plus under 512 KiB per read of a body sent
	// without Content-Length (see the package documentation). Defaults to
	// [MaxConcurrentReadsDefault].
	MaxConcurrentReads int
	// ReadSlotWait is how long a delivery waits for a read slot before the receiver
	// answers 503 with Retry-After. Waiting deliveries take freed slots in the order they
	// came. Defaults to [ReadSlotWaitDefault]; ledger.NoWait answers at once when no
	// slot is free.
	ReadSlotWait time.Duration
	// BodyReadTimeout bounds how long a delivery that holds a read slot has to send its
	// whole body, from the moment it takes the slot: a sender that stalls (headers with a
	// large Content-Length, then nothing) loses its slot, is answered 408 and its
	// connection closed. Keep it below ReadSlotWait, so that a delivery waiting for a
	// slot gets one, whatever the senders holding the slots do; and long enough for your
	// largest deliveries over the slowest link you accept. The receiver sets it with
	// http.ResponseController.SetReadDeadline, which replaces http.Server's read deadline
	// for the body; behind a middleware whose ResponseWriter does not unwrap to the
	// server's it cannot, and only the server's timeouts bound the read. Defaults to
	// [BodyReadTimeoutDefault]; a negative value sets no deadline.
	BodyReadTimeout time.Duration
	// Wait is how long a redelivery waits for the same delivery still in flight before
	// answering 409. Defaults to not waiting, as does ledger.NoWait.
	Wait time.Duration

	slots chan struct{} // read slots
}

// Status values of the receiver's JSON answer.
const (
	StatusProcessed = "processed" // the handler ran and committed
	StatusDuplicate = "duplicate" // processed before; nothing ran
	StatusRefused   = "refused"   // the handler refused it definitively
)

// ErrSchema: the ledger's schema lacks a table the receiver needs.
var ErrSchema = errors.New("oncekit/webhook: the schema lacks a table the receiver needs")

// SchemaError reports a table missing from the ledger's schema, found when the receiver
// is made, and the migration line that creates it. It matches [ErrSchema].
type SchemaError struct {
	// Schema is the ledger's schema.
	Schema string
	// Table is the missing table: idempotency_records (the ledger's) or entity_versions
	// (this package's, written by [Delivery.Newer]).
	Table string
	// Line is the migration line that creates it: ledger.MigrationLine or
	// [MigrationLine].
	Line string
	// Shard names the shard that lacks it, for a ledger on named shards; "" otherwise.
	Shard string
}

func (e *SchemaError) Error() string {
	files := "ledger.Migrations()"
	if e.Line == MigrationLine {
		files = "webhook.Migrations() (after ledger.Migrations())"
	}
	return fmt.Sprintf("oncekit/webhook: schema %q%s has no table %s: run migrate.Up(ctx, pool, %q), or apply %s with your migration tool",
		e.Schema, onShard(shard.Shard{Name: e.Shard}), e.Table, e.Schema, files)
}

// Is matches [ErrSchema].
func (e *SchemaError) Is(target error) bool { return target == ErrSchema }

// checkSchema makes sure the ledger's schema has the receiver's tables, so a receiver
// that lacks them is refused when it is made rather than answering 500 to deliveries.
func checkSchema(ctx context.Context, l *ledger.Ledger) error {
	for _, sh := range l.Router().Shards() {
		if err := checkShardSchema(ctx, l.Schema(), sh); err != nil {
			return err
		}
	}
	return nil
}

func checkShardSchema(ctx context.Context, schema string, sh shard.Shard) error {
	tables := []struct{ name, line string }{{"idempotency_records", ledger.MigrationLine}, {"entity_versions", MigrationLine}}
	var found [2]bool
	err := sh.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		pgx.Identifier{schema, tables[0].name}.Sanitize(), pgx.Identifier{schema, tables[1].name}.Sanitize()).
		Scan(&found[0], &found[1])
	if err != nil {
		return fmt.Errorf("oncekit/webhook: check the schema %q%s: %w", schema, onShard(sh), err)
	}
	for i, t := range tables {
		if !found[i] {
			return &SchemaError{Schema: schema, Table: t.name, Line: t.line, Shard: sh.Name}
		}
	}
	return nil
}

// onShard names a shard in a message, when the ledger has named ones.
func onShard(sh shard.Shard) string {
	if sh.Name == "" {
		return ""
	}
	return fmt.Sprintf(" on shard %q", sh.Name)
}

// New returns the webhook endpoint. It checks that the ledger's schema has the
// receiver's tables (migrate.Up creates them), and returns a [*SchemaError] naming the
// migration to run when it does not.
func New(ctx context.Context, cfg *Config) (http.Handler, error) {
	if cfg == nil || cfg.Ledger == nil || cfg.Verifier == nil || cfg.Handle == nil || cfg.Source == "" {
		return nil, errors.New("oncekit/webhook: Config needs Ledger, Verifier, Handle and Source")
	}
	c := *cfg
	if c.Tenant == "" {
		c.Tenant = c.Source
	}
	c.MaxBodyBytes = config.Or(c.MaxBodyBytes, MaxBodyDefault)
	c.MaxConcurrentReads = config.Or(c.MaxConcurrentReads, MaxConcurrentReadsDefault)
	c.ReadSlotWait = config.Or(c.ReadSlotWait, ReadSlotWaitDefault)
	c.BodyReadTimeout = config.Or(c.BodyReadTimeout, BodyReadTimeoutDefault)
	if c.MaxBodyBytes < 0 || c.MaxConcurrentReads < 0 {
		return nil, errors.New("oncekit/webhook: Config.MaxBodyBytes and MaxConcurrentReads must not be negative")
	}
	if ch, ok := c.Verifier.(interface{ check() error }); ok {
		if err := ch.check(); err != nil {
			return nil, err
		}
	}
	scope := keys.Scope{Tenant: c.Tenant, Operation: "webhook." + c.Source}
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, c.Ledger); err != nil {
		return nil, err
	}
	c.slots = make(chan struct{}, c.MaxConcurrentReads)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, scope) }), nil
}

// acquireSlot takes a read slot: a free one at once, else waiting up to ReadSlotWait
// (not at all with ledger.NoWait).
func (c *Config) acquireSlot(ctx context.Context) (int, error) {
	select {
	case c.slots <- struct{}{}:
		return 0, nil
	default:
	}
	busy := errors.New("too many deliveries are being read; redeliver later")
	if c.ReadSlotWait < 0 {
		return http.StatusServiceUnavailable, busy
	}
	t := time.NewTimer(c.ReadSlotWait)
	defer t.Stop()
	select {
	case c.slots <- struct{}{}:
		return 0, nil
	case <-t.C:
		return http.StatusServiceUnavailable, busy
	case <-ctx.Done():
		return http.StatusServiceUnavailable, ctx.Err()
	}
}

// authenticate reads a delivery's body and verifies its signature, holding a read slot
// from before the first byte is read until the verdict, so that an unauthenticated
// body is in memory only while it holds a slot. status is the answer to give when err
// is not nil.
func (c *Config) authenticate(w http.ResponseWriter, r *http.Request) (body []byte, v Verified, status int, err error) {
	if r.ContentLength > c.MaxBodyBytes {
		return nil, Verified{}, http.StatusRequestEntityTooLarge,
			fmt.Errorf("the body is %d bytes, over the limit of %d", r.ContentLength, c.MaxBodyBytes)
	}
	if status, err := c.acquireSlot(r.Context()); err != nil {
		return nil, Verified{}, status, err
	}
	defer func() { <-c.slots }()
	if body, status, err = c.read(w, r); err != nil {
		return nil, Verified{}, status, err
	}
	if v, err = c.Verifier.Verify(r.Header, body); err != nil {
		return nil, Verified{}, http.StatusUnauthorized, err
	}
	return body, v, 0, nil
}

// read reads the body of a delivery that holds a read slot, within BodyReadTimeout.
func (c *Config) read(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if c.BodyReadTimeout > 0 {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(c.BodyReadTimeout)) == nil {
			// Cleared once the body is read: the server's own reads on the connection
			// (the one that notices a client gone, the next request's) must not inherit it.
			defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
		}
	}
	body, err := readBody(r.Body, r.ContentLength, c.MaxBodyBytes)
	var ne net.Error
	switch {
	case err == nil:
		return body, 0, nil
	case errors.Is(err, errBodyTooLarge):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the body is over the limit of %d bytes", c.MaxBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return nil, http.StatusRequestTimeout, fmt.Errorf("the body was not received within %s; send it again", c.BodyReadTimeout)
	case r.ContentLength >= 0 && errors.Is(err, io.ErrUnexpectedEOF):
		return nil, http.StatusBadRequest, errors.New("the body is shorter than its Content-Length")
	}
	return nil, http.StatusBadRequest, errors.New("the body could not be read")
}

// errBodyTooLarge is readBody's answer to a body over its limit.
var errBodyTooLarge = errors.New("oncekit/webhook: body over the limit")

// readBody reads a body of declared length (-1 when unknown, as in a chunked request) of
// at most limit bytes. A declared length is read into one buffer of that size; an
// unknown one into small buffers, then one of limit bytes (see smallBodyMax), so that
// no buffer ever passes the limit.
func readBody(body io.Reader, declared, limit int64) ([]byte, error) {
	if declared >= 0 {
		buf := make([]byte, declared)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	buf := make([]byte, 0, min(smallBodyStart, limit))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) == limit {
				// Full: one more byte says whether the body goes on.
				var one [1]byte
				n, err := io.ReadFull(body, one[:])
				switch {
				case n > 0:
					return nil, errBodyTooLarge
				case err == io.EOF:
					return buf, nil
				}
				return nil, err
			}
			next := int64(2 * cap(buf))
			if next > smallBodyMax {
				next = limit
			}
			grown := make([]byte, len(buf), min(next, limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (c *Config) serve(w http.ResponseWriter, r *http.Request, scope keys.Scope) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		answer(w, http.StatusMethodNotAllowed, "error", "webhooks are POSTed")
		return
	}
	body, v, status, err := c.authenticate(w, r)
	if err != nil {
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "5")
		}
		if status != http.StatusUnauthorized {
			w.Header().Set("Connection", "close") // the rest of an unread body is not drained
		}
		answer(w, status, "error", err.Error())
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
	}, &ledger.DoOpts{Wait: c.Wait, Mode: ledger.ModeClaimFirst}) // the handler is never called for a redelivery
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
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		// Not "not processed": the handler's writes may have committed. A redelivery
		// settles it, answered as a duplicate if they did.
		w.Header().Set("Retry-After", "1")
		answer(w, http.StatusServiceUnavailable, "error", "the outcome of delivery "+v.ID+" is unknown (its commit's answer was lost); redeliver it")
	default:
		answer(w, http.StatusInternalServerError, "error", "the delivery was not processed; redeliver it")
	}
}

func answer(w http.ResponseWriter, status int, state, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": state, "detail": detail})
}

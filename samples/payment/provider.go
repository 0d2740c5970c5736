package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// provider simulates a payment provider: it charges and refunds, counts both in its own
// tables, and honours an Idempotency-Key header the way real providers do, backed by its
// own oncekit ledger. It can lose the response to a charge after committing it, as a
// network would.
type provider struct {
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	mu     sync.Mutex
	lost   map[string]bool // merchant/order whose first charge response was lost
	// statements charges with DoStatement; false on Citus, which refuses it, where a
	// charge goes through Do.
	statements bool
}

type chargeRequest struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
	// LoseFirstResponse asks the simulator to charge, then drop the connection instead
	// of answering, the first time it sees this order.
	LoseFirstResponse bool `json:"lose_first_response,omitempty"`
}

type chargeResponse struct {
	ChargeID int64 `json:"charge_id"`
	Amount   int64 `json:"amount"`
}

type refundRequest struct {
	OrderID           string `json:"order_id"`
	Amount            int64  `json:"amount"`
	LoseFirstResponse bool   `json:"lose_first_response,omitempty"`
}

type refundResponse struct {
	Refunded bool  `json:"refunded"`
	RefundID int64 `json:"refund_id,omitempty"`
}

func (p *provider) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", p.charge)
	mux.HandleFunc("POST /v1/refunds", p.refund)
	return mux
}

// chargeSQL charges: one statement, which DoStatement guards in one round trip.
const chargeSQL = `INSERT INTO provider_charges (merchant, order_id, amount, idempotency_key) VALUES ($1, $2, $3, $4)
	RETURNING id AS charge_id, amount`

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	var req chargeRequest
	body, ok := readJSON(w, r, &req)
	if !ok {
		return
	}
	merchant := r.Header.Get("X-Merchant")
	args := []any{merchant, req.OrderID, req.Amount, r.Header.Get("Idempotency-Key")}
	var resp []byte
	var err error
	if p.statements && r.Header.Get("Idempotency-Key") != "" {
		resp, err = p.onceStatement(r, merchant, "provider.charge", body, ledger.Statement{SQL: chargeSQL, Args: args})
	} else {
		resp, err = p.once(r, merchant, "provider.charge", body, func(ctx context.Context, tx pgx.Tx) (any, error) {
			var c chargeResponse
			err := tx.QueryRow(ctx, chargeSQL, args...).Scan(&c.ChargeID, &c.Amount)
			return c, err
		})
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if req.LoseFirstResponse && p.loseOnce(merchant+"/"+req.OrderID) {
		dropConnection(w) // charged and committed; the answer never arrives
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(resp)
}

func (p *provider) refund(w http.ResponseWriter, r *http.Request) {
	var req refundRequest
	body, ok := readJSON(w, r, &req)
	if !ok {
		return
	}
	merchant := r.Header.Get("X-Merchant")
	resp, err := p.once(r, merchant, "provider.refund", body, func(ctx context.Context, tx pgx.Tx) (any, error) {
		var chargeID int64
		err := tx.QueryRow(ctx, `SELECT id FROM provider_charges WHERE merchant = $1 AND order_id = $2 ORDER BY id LIMIT 1`,
			merchant, req.OrderID).Scan(&chargeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return refundResponse{Refunded: false}, nil // nothing was charged: nothing to refund
		}
		if err != nil {
			return nil, err
		}
		var id int64
		err = tx.QueryRow(ctx, `INSERT INTO provider_refunds (merchant, order_id, charge_id, amount, idempotency_key) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
			merchant, req.OrderID, chargeID, req.Amount, r.Header.Get("Idempotency-Key")).Scan(&id)
		return refundResponse{Refunded: true, RefundID: id}, err
	})
	if err != nil {
		writeError(w, err)
		return
	}
	if req.LoseFirstResponse && p.loseOnce(merchant+"/refund/"+req.OrderID) {
		dropConnection(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(resp)
}

// once runs fn exactly once per Idempotency-Key and returns its JSON response, byte for
// byte the same on a replay. Without the header every request runs.
func (p *provider) once(r *http.Request, merchant, op string, body []byte, fn func(context.Context, pgx.Tx) (any, error)) ([]byte, error) {
	run := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		v, err := fn(ctx, tx)
		if err != nil {
			return ledger.Response{}, err
		}
		b, err := json.Marshal(v)
		return ledger.Response{Code: http.StatusOK, Body: b}, err
	}
	ctx := r.Context()
	idem := r.Header.Get("Idempotency-Key")
	if idem == "" {
		var resp ledger.Response
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) (err error) {
			resp, err = run(ctx, tx)
			return err
		})
		return resp.Body, err
	}
	in, err := intent(idem, merchant, op, body)
	if err != nil {
		return nil, err
	}
	res, err := p.ledger.Do(ctx, in, run, &ledger.DoOpts{Wait: 0})
	return res.Body, err
}

// onceStatement is once for a request with an Idempotency-Key whose mutation is one
// statement returning one row: the statement and the key's record go in one statement
// and one round trip, and the provider answers with the row, the same bytes on a replay.
func (p *provider) onceStatement(r *http.Request, merchant, op string, body []byte, st ledger.Statement) ([]byte, error) {
	in, err := intent(r.Header.Get("Idempotency-Key"), merchant, op, body)
	if err != nil {
		return nil, err
	}
	res, err := p.ledger.DoStatement(r.Context(), in, st, nil)
	if err != nil {
		return nil, err
	}
	var rows []json.RawMessage
	if err := json.Unmarshal(res.Body, &rows); err != nil || len(rows) != 1 {
		return nil, fmt.Errorf("provider: the response stored for %s is not one row: %s", op, res.Body)
	}
	return rows[0], nil
}

// intent is the ledger's intent for a request with the Idempotency-Key idem: the
// merchant is the tenant, the request's body the fingerprint.
func intent(idem, merchant, op string, body []byte) (ledger.Intent, error) {
	key, err := keys.New(idem)
	if err != nil {
		return ledger.Intent{}, err
	}
	fp, err := keys.FingerprintJSON(json.RawMessage(body))
	if err != nil {
		return ledger.Intent{}, err
	}
	return ledger.Intent{Scope: keys.Scope{Tenant: merchant, Operation: op}, Key: key, Fingerprint: fp}, nil
}

func (p *provider) loseOnce(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lost[id] {
		return false
	}
	p.lost[id] = true
	return true
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<16))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil || r.Header.Get("X-Merchant") == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return nil, false
	}
	return body, true
}

func writeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ledger.ErrFingerprintMismatch):
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
	case errors.Is(err, ledger.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(fmt.Sprintf("%T cannot hijack", w))
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset, as a dropped network path looks to the client
		}
		_ = conn.Close()
	}
}

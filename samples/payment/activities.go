package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	tactivity "go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/activity"
)

// Order is a checkout: what the workflow gets, and the faults the demo injects into it.
type Order struct {
	ID     string `json:"id"`
	SKU    string `json:"sku"`
	Qty    int    `json:"qty"`
	Amount int64  `json:"amount"`
	// Tenant is the shop that takes the order; empty for the demo's one shop.
	Tenant string `json:"tenant,omitempty"`
	// Faults.
	KillAfterCharge    bool `json:"kill_after_charge,omitempty"`    // the worker dies after the provider charged
	LoseChargeResponse bool `json:"lose_charge_response,omitempty"` // the provider's answer is lost
	ShippingFails      bool `json:"shipping_fails,omitempty"`       // shipping refuses: compensate
	LoseRefundResponse bool `json:"lose_refund_response,omitempty"` // the provider's answer to the refund is lost
}

// defaultShop is the tenant of the demo's one shop, and of orders that name none.
const defaultShop = "shop"

// tenant is the shop that takes the order.
func (o Order) tenant() string {
	if o.Tenant == "" {
		return defaultShop
	}
	return o.Tenant
}

// Activity names, as registered.
const (
	actReserve = "inventory.reserve"
	actRelease = "inventory.release"
	actCharge  = "payments.charge"
	actRefund  = "payments.refund"
	actShip    = "shipping.create"
)

// deps are what the activities use.
type deps struct {
	pool     *pgxpool.Pool
	provider string // base URL
	http     *http.Client
}

// oncekit activities: every effect under the ledger, keys from the saga.

func (d *deps) reserve(ctx context.Context, o Order) (int64, error) {
	return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o Order) (int64, error) {
		return reserveIn(ctx, tx, "oncekit", o)
	}, nil)
}

func (d *deps) release(ctx context.Context, o Order) (bool, error) {
	return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o Order) (bool, error) {
		return releaseIn(ctx, tx, "oncekit", o)
	}, nil)
}

func (d *deps) charge(ctx context.Context, o Order) (int64, error) {
	return activity.External(ctx, o, func(ctx context.Context, call activity.Call, o Order) (int64, error) {
		var resp chargeResponse
		err := d.post(ctx, "/v1/charges", "oncekit", string(call.DownstreamKey),
			chargeRequest{OrderID: o.ID, Amount: o.Amount, LoseFirstResponse: o.LoseChargeResponse}, &resp)
		if err != nil {
			return 0, err
		}
		killAfterCharge(ctx, o)
		return resp.ChargeID, nil
	}, &activity.Opts{Purpose: "provider-charge"})
}

func (d *deps) refund(ctx context.Context, o Order) (bool, error) {
	return activity.External(ctx, o, func(ctx context.Context, call activity.Call, o Order) (bool, error) {
		var resp refundResponse
		err := d.post(ctx, "/v1/refunds", "oncekit", string(call.DownstreamKey), refundRequest{OrderID: o.ID, Amount: o.Amount, LoseFirstResponse: o.LoseRefundResponse}, &resp)
		return resp.Refunded, err
	}, &activity.Opts{Purpose: "provider-refund"})
}

func (d *deps) ship(ctx context.Context, o Order) (int64, error) {
	return activity.Do(ctx, o, func(ctx context.Context, tx pgx.Tx, _ activity.Call, o Order) (int64, error) {
		if o.ShippingFails {
			return 0, activity.Definitive("shipping_unavailable", "no carrier serves the address of "+o.ID)
		}
		return shipIn(ctx, tx, "oncekit", o)
	}, nil)
}

// naive activities: the same effects as plain activities without keys, as the Temporal
// samples write them.

func (d *deps) naiveReserve(ctx context.Context, o Order) (id int64, err error) {
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		id, err = reserveIn(ctx, tx, "naive", o)
		return err
	})
	return id, err
}

func (d *deps) naiveRelease(ctx context.Context, o Order) (released bool, err error) {
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		released, err = releaseIn(ctx, tx, "naive", o)
		return err
	})
	return released, err
}

func (d *deps) naiveCharge(ctx context.Context, o Order) (int64, error) {
	var resp chargeResponse
	err := d.post(ctx, "/v1/charges", "naive", "", chargeRequest{OrderID: o.ID, Amount: o.Amount, LoseFirstResponse: o.LoseChargeResponse}, &resp)
	if err != nil {
		return 0, err
	}
	killAfterCharge(ctx, o)
	return resp.ChargeID, nil
}

func (d *deps) naiveRefund(ctx context.Context, o Order) (bool, error) {
	var resp refundResponse
	err := d.post(ctx, "/v1/refunds", "naive", "", refundRequest{OrderID: o.ID, Amount: o.Amount, LoseFirstResponse: o.LoseRefundResponse}, &resp)
	return resp.Refunded, err
}

func (d *deps) naiveShip(ctx context.Context, o Order) (id int64, err error) {
	if o.ShippingFails {
		return 0, temporal.NewNonRetryableApplicationError("no carrier serves the address of "+o.ID, "shipping_unavailable", nil)
	}
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		id, err = shipIn(ctx, tx, "naive", o)
		return err
	})
	return id, err
}

// The business effects, the same for both sagas.

func reserveIn(ctx context.Context, tx pgx.Tx, mode string, o Order) (int64, error) {
	if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available - $4 WHERE tenant = $1 AND mode = $2 AND sku = $3`,
		o.tenant(), mode, o.SKU, o.Qty); err != nil {
		return 0, err
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO reservations (tenant, mode, order_id, sku, qty) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		o.tenant(), mode, o.ID, o.SKU, o.Qty).Scan(&id)
	return id, err
}

// releaseIn releases the order's reservation if there is one still held: a compensation
// must tolerate a step that never took effect.
func releaseIn(ctx context.Context, tx pgx.Tx, mode string, o Order) (bool, error) {
	var qty int
	err := tx.QueryRow(ctx, `UPDATE reservations SET released = true
		WHERE tenant = $1 AND id = (SELECT id FROM reservations WHERE tenant = $1 AND mode = $2 AND order_id = $3 AND NOT released ORDER BY id LIMIT 1)
		RETURNING qty`, o.tenant(), mode, o.ID).Scan(&qty)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, `UPDATE inventory SET available = available + $4 WHERE tenant = $1 AND mode = $2 AND sku = $3`, o.tenant(), mode, o.SKU, qty)
	return err == nil, err
}

func shipIn(ctx context.Context, tx pgx.Tx, mode string, o Order) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO shipments (tenant, mode, order_id) VALUES ($1, $2, $3) RETURNING id`, o.tenant(), mode, o.ID).Scan(&id)
	return id, err
}

// killAfterCharge kills the worker process right after the provider charged and before
// the activity can report, on the first attempt of orders marked for it.
func killAfterCharge(ctx context.Context, o Order) {
	if o.KillAfterCharge && tactivity.GetInfo(ctx).Attempt == 1 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute) // not reached
	}
}

// post calls the provider. A non-2xx answer or a transport error is returned as an
// error: the call may or may not have taken effect.
func (d *deps) post(ctx context.Context, path, merchant, idemKey string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.provider+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Merchant", merchant)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return fmt.Errorf("provider %s: %w", path, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("provider %s: %s: %s", path, resp.Status, bytes.TrimSpace(rb))
	}
	return json.Unmarshal(rb, out)
}

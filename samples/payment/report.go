package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/policy"
)

func isCompensated(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && (appErr.Type() == policy.ErrTypeCompensated || appErr.Type() == policy.ErrTypeCompensationFailed)
}

// tally is what one saga did to the world, counted in the database.
type tally struct {
	mode                                    string
	orders, shipped, compensated, failed    int
	charges, refunds, shipments             int
	dupCharges, dupRefunds, dupShipments    int
	charged, refunded, expected, stockDrift int64
	wantCompensated                         int
	firstErr                                error
}

type demoReport struct{ tallies []tally }

func report(ctx context.Context, pool *pgxpool.Pool, orders []Order, modes []string, outcomes map[string][]outcome) (demoReport, error) {
	var rep demoReport
	for _, mode := range modes {
		t := tally{mode: mode, orders: len(orders)}
		shippedQty := map[string]int{}
		for i, o := range orders {
			oc := outcomes[mode][i]
			switch {
			case oc.shipped:
				t.shipped++
				t.expected += o.Amount
				shippedQty[o.SKU] += o.Qty
			case oc.compensated:
				t.compensated++
			default:
				t.failed++
				if t.firstErr == nil {
					t.firstErr = fmt.Errorf("%s: %w", o.ID, oc.err)
				}
			}
			if o.ShippingFails {
				t.wantCompensated++
			}
		}
		q := func(sql string, dst ...any) error { return pool.QueryRow(ctx, sql, mode).Scan(dst...) }
		dup := func(table, col string) string {
			return `SELECT coalesce(sum(n), 0), coalesce(sum(n - 1) FILTER (WHERE n > 1), 0) FROM (SELECT count(*) AS n FROM ` + table +
				` WHERE ` + col + ` = $1 GROUP BY order_id) s`
		}
		if err := q(dup("provider_charges", "merchant"), &t.charges, &t.dupCharges); err != nil {
			return rep, err
		}
		if err := q(dup("provider_refunds", "merchant"), &t.refunds, &t.dupRefunds); err != nil {
			return rep, err
		}
		if err := q(dup("shipments", "mode"), &t.shipments, &t.dupShipments); err != nil {
			return rep, err
		}
		var sumCharged, sumRefunded int64
		if err := q(`SELECT coalesce(sum(amount), 0) FROM provider_charges WHERE merchant = $1`, &sumCharged); err != nil {
			return rep, err
		}
		if err := q(`SELECT coalesce(sum(amount), 0) FROM provider_refunds WHERE merchant = $1`, &sumRefunded); err != nil {
			return rep, err
		}
		t.charged, t.refunded = sumCharged, sumRefunded
		// Stock taken out of the warehouse should be exactly what shipped.
		var taken int64
		if err := q(`SELECT coalesce(sum(10000 - available), 0) FROM inventory WHERE mode = $1`, &taken); err != nil {
			return rep, err
		}
		var shipped int64
		for _, n := range shippedQty {
			shipped += int64(n)
		}
		t.stockDrift = taken - shipped
		rep.tallies = append(rep.tallies, t)
	}
	return rep, nil
}

// ok is the demo's verdict on oncekit's saga: every order finished, no duplicate, the
// money and the stock add up.
func (r demoReport) ok() bool {
	for _, t := range r.tallies {
		if t.mode == "oncekit" {
			return t.failed == 0 && t.compensated == t.wantCompensated && t.dupCharges == 0 && t.dupRefunds == 0 &&
				t.dupShipments == 0 && t.charged-t.refunded == t.expected && t.stockDrift == 0
		}
	}
	return false
}

func (r demoReport) print(w io.Writer, restarts int64, took time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "\t"
	for _, t := range r.tallies {
		head += t.mode + " saga\t"
	}
	fmt.Fprintln(tw, head)
	row := func(name string, f func(t tally) string) {
		line := name + "\t"
		for _, t := range r.tallies {
			line += f(t) + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	itoa := func(n int) string { return fmt.Sprint(n) }
	money := func(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }
	row("orders", func(t tally) string { return itoa(t.orders) })
	row("completed (shipped)", func(t tally) string { return itoa(t.shipped) })
	row("compensated", func(t tally) string { return itoa(t.compensated) })
	row("failed otherwise", func(t tally) string { return itoa(t.failed) })
	row("charges", func(t tally) string { return itoa(t.charges) })
	row("refunds", func(t tally) string { return itoa(t.refunds) })
	row("shipments", func(t tally) string { return itoa(t.shipments) })
	row("duplicate charges", func(t tally) string { return itoa(t.dupCharges) })
	row("duplicate refunds", func(t tally) string { return itoa(t.dupRefunds) })
	row("duplicate shipments", func(t tally) string { return itoa(t.dupShipments) })
	row("charged - refunded", func(t tally) string { return money(t.charged - t.refunded) })
	row("owed by shipped orders", func(t tally) string { return money(t.expected) })
	row("money balance", func(t tally) string {
		if d := t.charged - t.refunded - t.expected; d != 0 {
			return "OFF BY " + money(d)
		}
		return "ok"
	})
	row("stock drift (units)", func(t tally) string { return itoa(int(t.stockDrift)) })
	_ = tw.Flush()
	fmt.Fprintf(w, "\nworker processes SIGKILLed and restarted: %d; took %s\n", restarts, took.Round(time.Second))
	for _, t := range r.tallies {
		if t.firstErr != nil {
			fmt.Fprintf(w, "%s saga, first unexpected failure: %v\n", t.mode, t.firstErr)
		}
	}
	if r.ok() {
		fmt.Fprintln(w, "oncekit saga: every order finished, zero duplicates, money and stock balance")
	} else {
		fmt.Fprintln(w, "oncekit saga: FAILED, see the table")
	}
}

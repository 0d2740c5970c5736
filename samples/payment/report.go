package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/shard"
)

// outcome of one order in one saga.
type outcome struct {
	id                 string
	shipped            bool
	compensated        bool          // every compensation succeeded
	compensationFailed bool          // a compensation gave up: money or stock may be out of balance
	unfinished         bool          // still running when the run stopped waiting
	unsubmitted        bool          // not submitted: the run was stopped first
	secondAgrees       bool          // the second submission, if any, ended the same way
	took               time.Duration // from the first submission to the end
	err                error
}

func isCompensated(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == policy.ErrTypeCompensated
}

func isCompensationFailed(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == policy.ErrTypeCompensationFailed
}

// tally is what one saga did to the world, counted in the database.
type tally struct {
	mode                                    string
	orders, shipped, compensated, failed    int
	compensationFailed, unfinished          int
	seconds, secondsAgree                   int
	unclean                                 []string
	charges, refunds, shipments             int
	dupCharges, dupRefunds, dupShipments    int
	charged, refunded, expected, stockDrift int64
	wantCompensated                         int
	firstErr                                error
}

type demoReport struct {
	tallies []tally
	faults  string // the faults injected and the errors seen
	// The faults injected, at the end and when the submissions stopped: the same, as
	// no fault starts after.
	injected, injectedAtStop string
	// Leftovers found after the run, in oncekit's saga: ledger records pending past
	// their lease, and workflows still running.
	stuckRecords    int64
	runningWorkflow int64
}

// report counts what each saga did. The provider's tables are on the first pool; the
// shop's, on every pool (one per shard), are summed over them.
func report(ctx context.Context, pools []*pgxpool.Pool, orders []Order, modes []string, outcomes map[string][]outcome) (demoReport, error) {
	pool := pools[0]
	var rep demoReport
	for _, mode := range modes {
		t := tally{mode: mode}
		shippedQty := map[string]int{}
		for i, o := range orders {
			oc := outcomes[mode][i]
			if oc.unsubmitted {
				continue
			}
			t.orders++
			if twice(i) {
				t.seconds++
				if oc.secondAgrees {
					t.secondsAgree++
				}
			}
			switch {
			case oc.shipped:
				t.shipped++
				t.expected += o.Amount
				shippedQty[o.SKU] += o.Qty
			case oc.compensated:
				t.compensated++
			case oc.compensationFailed:
				t.compensationFailed++
				t.unclean = append(t.unclean, oc.id)
			case oc.unfinished:
				t.unfinished++
				t.unclean = append(t.unclean, oc.id)
			default:
				t.failed++
				t.unclean = append(t.unclean, oc.id)
				if t.firstErr == nil {
					t.firstErr = fmt.Errorf("%s: %w", o.ID, oc.err)
				}
			}
			if o.ShippingFails {
				t.wantCompensated++
			}
		}
		q := func(sql string, dst ...any) error { return pool.QueryRow(ctx, sql, mode).Scan(dst...) }
		// qAll sums two counts over every shard.
		qAll := func(sql string, a, b *int) error {
			for _, p := range pools {
				var x, y int
				if err := p.QueryRow(ctx, sql, mode).Scan(&x, &y); err != nil {
					return err
				}
				*a, *b = *a+x, *b+y
			}
			return nil
		}
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
		if err := qAll(dup("shipments", "mode"), &t.shipments, &t.dupShipments); err != nil {
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
		for _, p := range pools {
			var n int64
			if err := p.QueryRow(ctx, `SELECT coalesce(sum(10000 - available), 0) FROM inventory WHERE mode = $1`, mode).Scan(&n); err != nil {
				return rep, err
			}
			taken += n
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
			return t.failed == 0 && t.compensationFailed == 0 && t.unfinished == 0 && t.compensated == t.wantCompensated &&
				t.dupCharges == 0 && t.dupRefunds == 0 && t.dupShipments == 0 && t.charged-t.refunded == t.expected &&
				t.stockDrift == 0 && t.secondsAgree == t.seconds && r.stuckRecords == 0 && r.runningWorkflow == 0
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
	money := func(c int64) string {
		sign := ""
		if c < 0 {
			sign, c = "-", -c
		}
		return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
	}
	row("orders", func(t tally) string { return itoa(t.orders) })
	row("completed (shipped)", func(t tally) string { return itoa(t.shipped) })
	row("compensated", func(t tally) string { return itoa(t.compensated) })
	row("compensation failed", func(t tally) string { return itoa(t.compensationFailed) })
	row("unfinished", func(t tally) string { return itoa(t.unfinished) })
	row("failed otherwise", func(t tally) string { return itoa(t.failed) })
	row("second submissions", func(t tally) string { return itoa(t.seconds) })
	row("  ended as the first", func(t tally) string { return itoa(t.secondsAgree) })
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
	if r.faults != "" {
		fmt.Fprintln(w, r.faults)
	}
	fmt.Fprintf(w, "left over in oncekit's saga: %d ledger records pending past their lease, %d workflows still running\n",
		r.stuckRecords, r.runningWorkflow)
	for _, t := range r.tallies {
		if t.firstErr != nil {
			fmt.Fprintf(w, "%s saga, first unexpected failure: %v\n", t.mode, t.firstErr)
		}
		if t.mode == "oncekit" && len(t.unclean) > 0 {
			shown := t.unclean
			if len(shown) > 20 {
				shown = shown[:20]
			}
			fmt.Fprintf(w, "%s saga, orders not clean (%d): %s\n", t.mode, len(t.unclean), strings.Join(shown, " "))
		}
	}
	if r.ok() {
		fmt.Fprintln(w, "oncekit saga: every order finished, zero duplicates, money and stock balance")
	} else {
		fmt.Fprintln(w, "oncekit saga: FAILED, see the table")
	}
}

// checkLeftovers looks, after the run, for what oncekit's saga must not leave behind:
// ledger records pending past their lease, and workflows still running.
func (r *demoReport) checkLeftovers(ctx context.Context, router *shard.Router, c client.Client) error {
	l, err := ledger.NewSharded(router, &ledger.Config{Schema: demoSchema})
	if err != nil {
		return err
	}
	st, err := l.Stats(ctx)
	if err != nil {
		return err
	}
	r.stuckRecords = st.Stuck
	// Temporal's visibility store lags behind the workflows themselves: a workflow that
	// just ended may still count as running for a moment, so a count above zero is read
	// again for a few seconds before it is believed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
			Query: "ExecutionStatus = 'Running' AND WorkflowType = '" + wfCheckout + "'"})
		if err != nil {
			return err
		}
		r.runningWorkflow = resp.GetCount()
		if r.runningWorkflow == 0 || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

// operatorGuard is the operator's view of the oncekit agent's calls.
func operatorGuard(pool *pgxpool.Pool) (*ledger.Ledger, *agent.Guard, error) {
	l, err := ledger.New(pool, &ledger.Config{Schema: demoSchema})
	if err != nil {
		return nil, nil, err
	}
	g, err := agent.New(l, nil)
	return l, g, err
}

// column is what one agent did, counted in PostgreSQL.
type column struct {
	tickets, finished, escalated, unfinished      int
	emails, dupEmails, smtp, dupSMTP              int
	refunds, dupRefunds, changed, uncertain, kill int
}

type report struct {
	cols               map[string]*column
	approved, rejected int64
	took               time.Duration
	failures           []error
}

func collect(ctx context.Context, pool *pgxpool.Pool, cfg config, sup *supervisor, ap *approvalCount) (*report, error) {
	rep := &report{cols: map[string]*column{}, approved: ap.approved.Load(), rejected: ap.rejected.Load(), failures: sup.failures}
	for _, name := range agents {
		c := &column{tickets: cfg.tickets, kill: sup.killed[name]}
		q := func(sql string, dest ...any) error { return pool.QueryRow(ctx, sql, name).Scan(dest...) }
		err := errors.Join(
			q(`SELECT count(*) FILTER (WHERE outcome = 'finished'), count(*) FILTER (WHERE outcome = 'escalated') FROM outcomes WHERE agent = $1`, &c.finished, &c.escalated),
			q(`SELECT count(*), count(*) - count(DISTINCT ticket) FROM emails WHERE agent = $1`, &c.emails, &c.dupEmails),
			q(`SELECT count(*), count(*) - count(DISTINCT ticket) FROM smtp_messages WHERE agent = $1`, &c.smtp, &c.dupSMTP),
			q(`SELECT count(*), count(*) - count(DISTINCT ticket) FROM refunds WHERE agent = $1`, &c.refunds, &c.dupRefunds),
			q(`SELECT count(*) FILTER (WHERE kind = 'changed'), count(*) FILTER (WHERE kind = 'uncertain') FROM events WHERE agent = $1`, &c.changed, &c.uncertain),
		)
		if err != nil {
			return nil, err
		}
		c.unfinished = c.tickets - c.finished - c.escalated
		rep.cols[name] = c
	}
	return rep, nil
}

func (r *report) print(out io.Writer) {
	o, n, tm := r.cols[oncekitAgent], r.cols[naiveAgent], r.cols[temporalAgent]
	fmt.Fprintf(out, "\n%42s %14s %12s %18s\n", "", "oncekit agent", "naive agent", "oncekit, Temporal")
	row := func(label string, a, b, c any) { fmt.Fprintf(out, "%42s %14v %12v %18v\n", label, a, b, c) }
	row("tickets", o.tickets, n.tickets, tm.tickets)
	row("finished", o.finished, n.finished, tm.finished)
	row("escalated to the operator", o.escalated, n.escalated, tm.escalated)
	row("unfinished", o.unfinished, n.unfinished, tm.unfinished)
	row("emails sent (API)", o.emails, n.emails, tm.emails)
	row("duplicate emails", o.dupEmails, n.dupEmails, tm.dupEmails)
	row("team messages (SMTP)", o.smtp, n.smtp, tm.smtp)
	row("duplicate SMTP messages", o.dupSMTP, n.dupSMTP, tm.dupSMTP)
	row("refunds", o.refunds, n.refunds, tm.refunds)
	row("duplicate refunds", o.dupRefunds, n.dupRefunds, tm.dupRefunds)
	row("calls refused: the model changed its mind", o.changed, "-", tm.changed)
	row("uncertain SMTP sends shown to the operator", o.uncertain, "-", tm.uncertain)
	row("refunds approved / rejected (both oncekit)", fmt.Sprintf("%d / %d", r.approved, r.rejected), "-", "")
	row("agent processes SIGKILLed", o.kill, n.kill, tm.kill)
	fmt.Fprintf(out, "\ntook %s\n", r.took.Round(time.Second))
	if err := r.check(); err != nil {
		fmt.Fprintln(out, "oncekit agents:", err)
		return
	}
	fmt.Fprintln(out, "oncekit agents: every ticket finished or escalated, zero duplicate emails, messages and refunds")
}

// check reports what the oncekit agents got wrong, if anything.
func (r *report) check() error {
	var errs []error
	errs = append(errs, r.failures...)
	for _, name := range []string{oncekitAgent, temporalAgent} {
		o := r.cols[name]
		if o.dupEmails+o.dupSMTP+o.dupRefunds != 0 {
			errs = append(errs, fmt.Errorf("%s: %d duplicate emails, %d duplicate SMTP messages, %d duplicate refunds", name, o.dupEmails, o.dupSMTP, o.dupRefunds))
		}
		if o.unfinished != 0 {
			errs = append(errs, fmt.Errorf("%s: %d tickets neither finished nor escalated", name, o.unfinished))
		}
	}
	return errors.Join(errs...)
}

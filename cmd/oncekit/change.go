package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

func (a *app) changeCommand(action ledger.Action) *cobra.Command {
	var f filters
	var reason, who string
	var yes, force, dryRun bool
	cmd := &cobra.Command{
		Use: string(action) + " [TENANT OPERATION KEY]",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 3 {
				return usageError{fmt.Sprintf("%s takes TENANT OPERATION KEY, or no argument and filters (got %d arguments)", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: a.runE(func(_ *cobra.Command, args []string) error {
			if who == "" {
				who = actor()
			}
			c := change{action: action, reason: reason, actor: who, yes: yes, force: force, dryRun: dryRun}
			if len(args) == 3 {
				if f.any() {
					return usageError{"give TENANT OPERATION KEY or filters, not both"}
				}
				return a.changeOne(c, keys.Scope{Tenant: args[0], Operation: args[1]}, keys.Key(args[2]))
			}
			if !f.any() {
				return usageError{fmt.Sprintf("%s needs TENANT OPERATION KEY, or filters that choose records (--tenant, --operation, --older-than, ...)", action)}
			}
			c.id = f.id
			return a.changeMany(c, &f)
		}),
	}
	if action == ledger.ActionRelease {
		cmd.Short = "Delete a pending record stuck in progress, so the next attempt starts afresh"
		cmd.Long = `release deletes a pending record: the claim of an external call whose owner is gone.
The next attempt claims the key afresh and makes its external call again, with the same
downstream key, so a provider that deduplicates by it does not charge twice.

Without --yes it shows the record (owner, lease, attempts) and changes nothing. A record
whose lease is live is refused unless --force: its attempt may still be running. With
filters instead of TENANT OPERATION KEY it releases every pending record they choose
whose lease ran out (with --force, live ones too), after the same dry run. Each release
keeps an audit row, with --reason, that inspect shows.`
		cmd.Example = `  oncekit release shop payments.charge 'v1:run:0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44:5'
  oncekit release shop payments.charge 'v1:run:0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44:5' -y --reason 'INC-311: worker host lost'
  oncekit release --stuck --tenant shop --older-than 1h
  oncekit release --stuck --tenant shop --older-than 1h -y --reason 'INC-311: worker host lost'`
		cmd.Flags().BoolVar(&force, "force", false, "release a record whose lease is live: only when its owner is known to be gone")
	} else {
		cmd.Short = "Delete a completed or failed record, so the next request with its key runs again"
		cmd.Long = `evict deletes a completed or failed record: a stored result known to be wrong. The
next request with the key runs again instead of replaying it.

Without --yes it shows the record and changes nothing. With filters instead of TENANT
OPERATION KEY it evicts every completed or failed record they choose (--state narrows to
one), after the same dry run. Each eviction keeps an audit row, with --reason, that
inspect shows.`
		cmd.Example = `  oncekit evict shop orders.create order-17
  oncekit evict shop orders.create order-17 -y --reason 'INC-312: a wrong price was stored'
  oncekit evict --tenant shop --operation orders.create --state failed --since 2h --dry-run`
	}
	fl := cmd.Flags()
	fl.StringVar(&reason, "reason", "", "why, such as the incident's reference; required with --yes, kept in the audit row")
	fl.StringVar(&who, "actor", "", "who makes the change, kept in the audit row (default: the OS user and host, such as alice@bastion)")
	fl.BoolVarP(&yes, "yes", "y", false, "make the change; without it, show what would change")
	fl.BoolVar(&dryRun, "dry-run", false, "show what would change and change nothing, as without --yes, and exit 0")
	f.register(fl, false)
	return cmd
}

// change is a release or eviction as the command line asks it.
type change struct {
	action             ledger.Action
	reason, actor      string
	yes, force, dryRun bool
	id                 identity // the Temporal IDs of the filters, for a hint
}

// planView is what release and evict print: what they would change, or did.
type planView struct {
	Action  string       `json:"action"`
	DryRun  bool         `json:"dry_run"`
	Records []recordView `json:"records"`
	// Refused are records chosen that the change does not apply to, with why.
	Refused []refusal   `json:"refused"`
	Done    []auditView `json:"done"`
	More    bool        `json:"more"`
}

type refusal struct {
	Tenant    string `json:"tenant"`
	Operation string `json:"operation"`
	Key       string `json:"key"`
	Reason    string `json:"reason"`
}

func (c change) check() error {
	if c.yes && c.dryRun {
		return usageError{"--yes and --dry-run contradict each other: give one"}
	}
	if c.yes && c.reason == "" {
		return usageError{fmt.Sprintf("%s --yes needs --reason: say why, such as the incident's reference; it is kept in the audit row", c.action)}
	}
	if len(c.reason) > ledger.MaxReasonLen || len(c.actor) > ledger.MaxActorLen {
		return usageError{fmt.Sprintf("--reason and --actor are at most %d and %d bytes", ledger.MaxReasonLen, ledger.MaxActorLen)}
	}
	return nil
}

func (a *app) changeOne(c change, scope keys.Scope, key keys.Key) error {
	if err := validRecordID(scope, key); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	r, err := l.Get(a.ctx, scope, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFound(scope, key)
	}
	if err != nil {
		return err
	}
	if (r.State == ledger.StatePending) != (c.action == ledger.ActionRelease) {
		return exitError{exitWrongState, strings.TrimPrefix((&ledger.WrongStateError{Scope: scope, Key: key, Action: c.action, State: r.State}).Error(), "oncekit/ledger: ")}
	}
	return a.apply(l, c, []ledger.Record{*r}, false)
}

func (a *app) changeMany(c change, f *filters) error {
	if err := c.check(); err != nil {
		return err
	}
	if _, err := f.opts(time.Now()); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	o, err := f.opts(a.dbNow())
	if err != nil {
		return err
	}
	recs, more, err := chooseMany(a.ctx, l, c, o, f.limit)
	if err != nil {
		return err
	}
	return a.apply(l, c, recs, more)
}

// chooseMany returns the records filters o choose that c applies to: pending ones for a
// release (only those whose lease ran out, unless c.force), completed and failed ones for
// an eviction; at most limit, and whether more match.
func chooseMany(ctx context.Context, l *ledger.Ledger, c change, o ledger.ListOpts, limit int) ([]ledger.Record, bool, error) {
	var states []ledger.State
	switch {
	case c.action == ledger.ActionRelease:
		if o.State != "" && o.State != ledger.StatePending {
			return nil, false, usageError{"release applies to pending records: drop --state, or evict instead"}
		}
		states = []ledger.State{ledger.StatePending}
		o.Stuck = o.Stuck || !c.force // without --force, only those whose lease ran out
	case o.State == ledger.StatePending:
		return nil, false, usageError{"evict applies to completed and failed records: a pending record is released"}
	case o.State != "":
		states = []ledger.State{o.State}
	default:
		states = []ledger.State{ledger.StateCompleted, ledger.StateFailed}
	}
	var recs []ledger.Record
	more := false
	for _, s := range states {
		o := o
		o.State, o.Limit = s, limit+1
		got, err := l.List(ctx, &o)
		if err != nil {
			return nil, false, err
		}
		recs = append(recs, got...)
	}
	if len(recs) > limit {
		recs, more = recs[:limit], true
	}
	return recs, more, nil
}

// apply shows the records c would change, and, with --yes, changes each one that is
// still as shown, keeping its audit row.
func (a *app) apply(l *ledger.Ledger, c change, recs []ledger.Record, more bool) error {
	now := a.dbNow()
	pv, targets, err := plan(a.ctx, l, c, recs, more, now)
	if err != nil {
		return err
	}
	err = a.emit(pv, func(w *tabwriter.Writer) { printPlan(w, pv, now) })
	if err != nil {
		return err
	}
	switch {
	case len(pv.Records) == 0:
		msg := fmt.Sprintf("no record to %s matches", c.action)
		if hint := workflowHint(c.id, nil); hint != "" {
			msg += " (" + hint + ")"
		}
		return exitError{exitNotFound, msg}
	case c.dryRun:
		return nil // asked for: the plan is the answer
	case !c.yes && len(targets) > 0:
		return exitError{exitRefused, fmt.Sprintf("nothing changed: run again with %s to %s %s", missingToAct(c.reason != ""), c.action, plural(len(targets), "record"))}
	case len(pv.Refused) > 0:
		return exitError{exitRefused, fmt.Sprintf("%s refused; see above", plural(len(pv.Refused), "record"))}
	}
	return nil
}

// plan says what c would change among recs, and, with c.yes, changes each record that
// is still as shown, keeping its audit row. It returns the records it would change or
// changed.
func plan(ctx context.Context, l *ledger.Ledger, c change, recs []ledger.Record, more bool, now time.Time) (planView, []ledger.Record, error) {
	pv := planView{Action: string(c.action), DryRun: !c.yes, Records: []recordView{}, Refused: []refusal{}, Done: []auditView{}, More: more}
	var targets []ledger.Record
	for _, r := range recs {
		v := view(r, false)
		pv.Records = append(pv.Records, v)
		if c.action == ledger.ActionRelease && !r.LeaseExpired && !c.force {
			pv.Refused = append(pv.Refused, refusal{v.Tenant, v.Operation, v.Key,
				fmt.Sprintf("its lease is live (%s left, owner %s): its attempt may still be running; wait for the lease to run out, or add --force if that owner is known to be gone",
					r.LeaseUntil.Sub(now).Round(time.Second), r.OwnerToken)})
			continue
		}
		targets = append(targets, r)
	}
	if c.yes {
		for _, r := range targets {
			r := r
			entry, err := l.Change(ctx, c.action, r.Scope, r.Key, &ledger.ChangeOpts{Actor: c.actor, Reason: c.reason, Force: c.force, Expect: &r})
			var changed *ledger.RecordChangedError
			switch {
			case err == nil:
				pv.Done = append(pv.Done, auditOf(entry))
			case errors.Is(err, ledger.ErrNotFound), errors.As(err, &changed):
				pv.Refused = append(pv.Refused, refusal{r.Scope.Tenant, r.Scope.Operation, string(r.Key),
					"it changed since it was read, and was left as it is: look at it again"})
			default:
				return pv, nil, err
			}
		}
	}
	return pv, targets, nil
}

// missingToAct names what a dry run lacks to act: --yes, and --reason unless given.
func missingToAct(hasReason bool) string {
	if hasReason {
		return "--yes (-y)"
	}
	return "--yes (-y) and --reason"
}

func printPlan(w *tabwriter.Writer, pv planView, now time.Time) {
	verb := map[bool]string{true: "would " + pv.Action, false: pastTense(pv.Action)}[pv.DryRun]
	if len(pv.Refused) == len(pv.Records) {
		verb = "will not " + pv.Action
	}
	refused := map[string]string{}
	for _, r := range pv.Refused {
		refused[r.Tenant+"\x00"+r.Operation+"\x00"+r.Key] = r.Reason
	}
	for _, v := range pv.Records {
		fmt.Fprintf(w, "%s the %s record of key %q in %s/%s\n", verb, v.State, v.Key, v.Tenant, v.Operation)
		fmt.Fprintf(w, "  state\t%s\n", v.stateText(now))
		if v.State == string(ledger.StatePending) {
			fmt.Fprintf(w, "  owner\t%s\n", v.OwnerToken)
		}
		fmt.Fprintf(w, "  attempts\t%d\n  created\t%s (%s)\n", v.Attempts, rfc3339(v.CreatedAt), ago(v.CreatedAt, now))
		if why, ok := refused[v.Tenant+"\x00"+v.Operation+"\x00"+v.Key]; ok {
			fmt.Fprintf(w, "  refused: %s\n", why)
		}
	}
	if pv.More {
		fmt.Fprintf(w, "more records match than --limit: those are left for another run\n")
	}
	if len(pv.Records) > 0 && len(pv.Refused) < len(pv.Records) {
		if pv.Action == string(ledger.ActionRelease) {
			fmt.Fprintf(w, "after a release the next attempt claims the key afresh and makes its external call again, with the same downstream key\n")
		} else {
			fmt.Fprintf(w, "after an eviction the next request with the key runs again instead of replaying\n")
		}
	}
	for _, d := range pv.Done {
		fmt.Fprintf(w, "audit row %d: %s by %s: %q\n", d.ID, pastTense(d.Action), d.Actor, d.Reason)
	}
}

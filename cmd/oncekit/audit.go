package main

import (
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// auditFlags choose the audit rows audit lists.
type auditFlags struct {
	tenant, operation, key, actor, action string
	since, until, topic, eventID          string
	limit                                 int
}

func (a *app) auditCommand() *cobra.Command {
	var f auditFlags
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List what operators changed, newest first: releases, evictions and outbox retries, by whom and why",
		Long: `audit lists the audit rows that release, evict and outbox retry keep, newest first:
when, the action, who (--actor, or the OS user and host, and the database role), why
(--reason), and what: the record (tenant, operation, key, and the state it was in) or
the outbox event (its ID, topic, and the attempts it died after). The rows outlive what
they describe. Filters combine: --tenant, --operation and --key choose records' rows,
--topic and --event-id events' rows, and --actor, --action, --since and --until both.`,
		Example: `  oncekit audit --since 24h
  oncekit audit --tenant shop --operation payments.charge --key 'v1:run:0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44:5'
  oncekit audit --actor alice --action release --json
  oncekit audit --topic payments.captured`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error { return a.audit(f) }),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "only the rows of this tenant's records")
	fl.StringVar(&f.operation, "operation", "", "only the rows of this operation's records")
	fl.StringVar(&f.key, "key", "", "only the rows of records with this key")
	fl.StringVar(&f.topic, "topic", "", "only the rows of this topic's outbox events")
	fl.StringVar(&f.eventID, "event-id", "", "only the rows of this outbox event")
	fl.StringVar(&f.actor, "actor", "", "only the changes this actor made, as their rows name them (such as alice@bastion)")
	fl.StringVar(&f.action, "action", "", "only this action: release, evict or retry")
	fl.StringVar(&f.since, "since", "", "only changes made at or after this time: RFC 3339 (2025-01-02T15:04:05Z) or a duration ago (24h)")
	fl.StringVar(&f.until, "until", "", "only changes made before this time: RFC 3339 or a duration ago")
	fl.IntVar(&f.limit, "limit", 100, fmt.Sprintf("at most this many rows, 1 to %d", maxListLimit))
	return cmd
}

// auditRow is an audit row as audit lists it: a record's or an outbox event's.
type auditRow struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	Actor  string    `json:"actor"`
	DBUser string    `json:"db_user"`
	Reason string    `json:"reason"`
	// A record's row.
	Tenant    string      `json:"tenant,omitempty"`
	Operation string      `json:"operation,omitempty"`
	Key       string      `json:"key,omitempty"`
	Forced    bool        `json:"forced,omitempty"`
	Before    *recordView `json:"before,omitempty"`
	// An outbox event's row.
	EventID   string `json:"event_id,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// auditListView is what audit prints.
type auditListView struct {
	Rows []auditRow `json:"rows"`
	More bool       `json:"more"`
}

func (a *app) audit(f auditFlags) error {
	if f.limit <= 0 || f.limit > maxListLimit {
		return usageError{fmt.Sprintf("--limit %d: give 1 to %d", f.limit, maxListLimit)}
	}
	records := f.topic == "" && f.eventID == "" && f.action != outbox.ActionRetry
	events := f.tenant == "" && f.operation == "" && f.key == "" && f.action != string(ledger.ActionRelease) && f.action != string(ledger.ActionEvict)
	switch f.action {
	case "", string(ledger.ActionRelease), string(ledger.ActionEvict), outbox.ActionRetry:
	default:
		return usageError{fmt.Sprintf("--action %q: use release, evict or retry", bounded(f.action))}
	}
	if !records && !events {
		return usageError{"--tenant, --operation and --key choose records' rows, --topic and --event-id events' rows, and --action release and evict records', retry events': not both"}
	}
	var eventID uuid.UUID
	if f.eventID != "" {
		var err error
		if eventID, err = parseEventID(f.eventID); err != nil {
			return err
		}
	}
	if f.key != "" {
		if err := keys.Key(f.key).ValidateLen(ledger.MaxKeyLenLimit); err != nil {
			return usageError{err.Error()}
		}
	}
	// Checked before connecting; durations ago are reckoned again below by the
	// database's clock, as the rows' times are.
	if _, err := parseWhen("--since", f.since, time.Now()); err != nil {
		return err
	}
	if _, err := parseWhen("--until", f.until, time.Now()); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	now := a.dbNow()
	since, _ := parseWhen("--since", f.since, now)
	until, _ := parseWhen("--until", f.until, now)
	var rows []auditRow
	if records {
		entries, err := l.ListAudit(a.ctx, &ledger.AuditOpts{Tenant: f.tenant, Operation: f.operation, Key: keys.Key(f.key),
			Actor: f.actor, Action: ledger.Action(f.action), Since: since, Until: until, Limit: f.limit + 1})
		if err != nil {
			return err
		}
		for _, e := range entries {
			v := auditOf(e)
			rows = append(rows, auditRow{At: e.At, Action: v.Action, Actor: v.Actor, DBUser: v.DBUser, Reason: v.Reason,
				Tenant: e.Scope.Tenant, Operation: e.Scope.Operation, Key: string(e.Key), Forced: v.Forced, Before: &v.Before})
		}
	}
	if events {
		out, err := outbox.New(a.pool, &outbox.Config{Schema: a.schema})
		if err != nil {
			return err
		}
		entries, err := out.ListAudit(a.ctx, &outbox.AuditOpts{EventID: eventID, Topic: f.topic, Actor: f.actor, Since: since,
			Until: until, Limit: f.limit + 1})
		if err != nil {
			return err
		}
		for _, e := range entries {
			rows = append(rows, auditRow{At: e.At, Action: e.Action, Actor: e.Actor, DBUser: e.DBUser, Reason: e.Reason,
				EventID: e.EventID.String(), Topic: e.Topic, Attempts: e.Attempts, LastError: e.LastError})
		}
	}
	slices.SortStableFunc(rows, func(x, y auditRow) int { return y.At.Compare(x.At) })
	lv := auditListView{Rows: rows, More: len(rows) > f.limit}
	lv.Rows = lv.Rows[:min(len(rows), f.limit)]
	if lv.Rows == nil {
		lv.Rows = []auditRow{}
	}
	err = a.emit(lv, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "AT\tACTION\tBY\tWHAT\tREASON")
		for _, r := range lv.Rows {
			what := fmt.Sprintf("outbox event %s (%s), dead after %s", r.EventID, r.Topic, plural(r.Attempts, "attempt"))
			if r.EventID == "" {
				what = fmt.Sprintf("%s/%s %s, %s", r.Tenant, r.Operation, r.Key, r.Before.State)
				if r.Forced {
					what += ", its lease live (forced)"
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%q\n", rfc3339(r.At), r.Action, r.Actor, what, r.Reason)
		}
	})
	if err == nil && lv.More && !a.json {
		fmt.Fprintf(a.errOut, "oncekit: more rows match than --limit: narrow by --since, --until or the filters\n")
	}
	return err
}

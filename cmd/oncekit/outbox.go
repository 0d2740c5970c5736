package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

func (a *app) outbox() (*outbox.Outbox, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	return outbox.New(a.pool, &outbox.Config{Schema: a.schema})
}

func (a *app) outboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use: "outbox",
		Example: `  oncekit outbox dead
  oncekit outbox retry --topic payments.captured`,
		Short: "Inspect the outbox's events, list and retry dead ones, purge published ones",
		Args:  args(0, ""),
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return usageError{"outbox needs a subcommand: inspect, dead, retry or purge"}
		}),
	}
	var showBody bool
	inspect := &cobra.Command{
		Use: "inspect ID",
		Example: `  oncekit outbox inspect 01a23339-c7b5-7bd6-bbd3-2b68573400ff
  oncekit outbox inspect 01a23339-c7b5-7bd6-bbd3-2b68573400ff --show-body`,
		Short: "Show one event: state, attempts, last error, trace",
		Args:  args(1, "an event ID"),
		RunE:  a.runE(func(_ *cobra.Command, args []string) error { return a.outboxInspect(args[0], showBody) }),
	}
	inspect.Flags().BoolVar(&showBody, "show-body", false, "print the payload (it may hold customer data); without it, its size")

	var topic string
	var limit int
	dead := &cobra.Command{
		Use: "dead",
		Example: `  oncekit outbox dead
  oncekit outbox dead --topic payments.captured --json`,
		Short: "List dead events, oldest first",
		Long:  "outbox dead lists the events that kept failing and are no longer published, oldest first, with their last error.",
		Args:  args(0, ""),
		RunE:  a.runE(func(*cobra.Command, []string) error { return a.outboxDead(topic, limit) }),
	}
	dead.Flags().StringVar(&topic, "topic", "", "only this topic's events")
	dead.Flags().IntVar(&limit, "limit", outbox.DeadLimitDefault, fmt.Sprintf("at most this many events, 1 to %d", maxListLimit))

	var rt retryFlags
	retry := &cobra.Command{
		Use: "retry [ID...]",
		Example: `  oncekit outbox retry 01a23339-c7b5-7bd6-bbd3-2b68573400ff --reason 'INC-313: broker schema fixed'
  oncekit outbox retry --topic payments.captured
  oncekit outbox retry --topic payments.captured -y --reason 'INC-313: broker schema fixed'`,
		Short: "Make dead events pending again: by ID, by --topic, or --all; all or nothing; audited",
		Long: `outbox retry makes dead events pending again, attempts reset, so dispatchers publish
them. It retries the IDs given, or every dead event of --topic, or with --all every dead
event, in one transaction: if one of the IDs is not dead, or no event has it, none is
retried. --topic and --all show what they would retry and change nothing without --yes;
--dry-run shows it for IDs too. A retry needs --reason and keeps an audit row per event
(who, when, why, the attempts and last error it died with), which oncekit audit lists.`,
		RunE: a.runE(func(_ *cobra.Command, args []string) error {
			if rt.actor == "" {
				rt.actor = actor()
			}
			return a.outboxRetry(args, rt)
		}),
	}
	retry.Flags().StringVar(&rt.topic, "topic", "", "retry every dead event of this topic")
	retry.Flags().BoolVar(&rt.all, "all", false, "retry every dead event")
	retry.Flags().BoolVarP(&rt.yes, "yes", "y", false, "with --topic or --all: retry; without it, show what would be retried")
	retry.Flags().BoolVar(&rt.dryRun, "dry-run", false, "show what would be retried and retry nothing, and exit 0")
	retry.Flags().StringVar(&rt.reason, "reason", "", "why, such as the incident's reference; required to retry, kept in the audit rows")
	retry.Flags().StringVar(&rt.actor, "actor", "", "who retries, kept in the audit rows (default: the OS user and host, such as alice@bastion)")

	var p purgeFlags
	purge := &cobra.Command{
		Use: "purge",
		Example: `  oncekit outbox purge --dry-run
  oncekit outbox purge -y --published-retention 72h`,
		Short: "Delete events published longer ago than --published-retention, in batches",
		Long:  "outbox purge deletes published events older than --published-retention, in batches; without --yes it counts them. Pending and dead events are never purged.",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			if err := p.check(); err != nil {
				return err
			}
			if err := a.connect(); err != nil {
				return err
			}
			out, err := outbox.New(a.pool, &outbox.Config{Schema: a.schema, PublishedRetention: p.retention})
			if err != nil {
				return err
			}
			return a.purge(p, []purgeStep{outboxPurge(a, out, p)})
		}),
	}
	p.register(purge, true)
	cmd.AddCommand(inspect, dead, retry, purge)
	return cmd
}

// eventView is an event as the command shows it.
type eventView struct {
	ID            string     `json:"id"`
	Topic         string     `json:"topic"`
	OrderingKey   string     `json:"ordering_key,omitempty"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	CreatedAt     time.Time  `json:"created_at"`
	AvailableAt   *time.Time `json:"available_at,omitempty"`
	PublishedAt   *time.Time `json:"published_at,omitempty"`
	LockedUntil   *time.Time `json:"locked_until,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	TraceParent   string     `json:"traceparent,omitempty"`
	PayloadBytes  int        `json:"payload_bytes"`
	Payload       *string    `json:"payload,omitempty"`
	PayloadBase64 *string    `json:"payload_base64,omitempty"`
}

func parseEventID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, usageError{fmt.Sprintf("%q is not an event ID (a UUID; oncekit outbox dead lists them)", bounded(s))}
	}
	return id, nil
}

func (a *app) outboxInspect(arg string, showBody bool) error {
	id, err := parseEventID(arg)
	if err != nil {
		return err
	}
	out, err := a.outbox()
	if err != nil {
		return err
	}
	e, err := out.Get(a.ctx, id)
	if errors.Is(err, outbox.ErrEventNotFound) {
		return exitError{exitNotFound, fmt.Sprintf("no event with ID %s (published events are purged after their retention)", id)}
	}
	if err != nil {
		return err
	}
	v := eventView{ID: e.ID.String(), Topic: e.Topic, OrderingKey: e.OrderingKey, State: e.State, Attempts: e.Attempts,
		CreatedAt: e.CreatedAt, LastError: e.LastError, TraceParent: e.TraceParent, PayloadBytes: len(e.Payload)}
	if e.State == outbox.StatePending {
		at := e.AvailableAt
		v.AvailableAt = &at
	}
	if !e.PublishedAt.IsZero() {
		v.PublishedAt = &e.PublishedAt
	}
	if !e.LockedUntil.IsZero() {
		v.LockedUntil = &e.LockedUntil
	}
	if showBody {
		if utf8.Valid(e.Payload) {
			s := string(e.Payload)
			v.Payload = &s
		} else {
			s := base64.StdEncoding.EncodeToString(e.Payload)
			v.PayloadBase64 = &s
		}
	}
	now := a.dbNow()
	return a.emit(v, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "id\t%s\ntopic\t%s\n", v.ID, v.Topic)
		if v.OrderingKey != "" {
			fmt.Fprintf(w, "ordering key\t%s\n", v.OrderingKey)
		}
		fmt.Fprintf(w, "state\t%s\nattempts\t%d\ncreated\t%s (%s)\n", v.State, v.Attempts, rfc3339(v.CreatedAt), ago(v.CreatedAt, now))
		if v.AvailableAt != nil {
			fmt.Fprintf(w, "next try\t%s (%s)\n", rfc3339(*v.AvailableAt), ago(*v.AvailableAt, now))
		}
		if v.LockedUntil != nil {
			fmt.Fprintf(w, "claimed\tby a dispatcher until %s\n", rfc3339(*v.LockedUntil))
		}
		if v.PublishedAt != nil {
			fmt.Fprintf(w, "published\t%s\n", rfc3339(*v.PublishedAt))
		}
		if v.LastError != "" {
			fmt.Fprintf(w, "last error\t%s\n", oneLine(v.LastError))
		}
		if v.TraceParent != "" {
			fmt.Fprintf(w, "traceparent\t%s\n", v.TraceParent)
		}
		switch {
		case v.Payload != nil:
			fmt.Fprintf(w, "payload\t%d bytes: %s\n", v.PayloadBytes, *v.Payload)
		case v.PayloadBase64 != nil:
			fmt.Fprintf(w, "payload\t%d bytes, base64: %s\n", v.PayloadBytes, *v.PayloadBase64)
		default:
			fmt.Fprintf(w, "payload\t%d bytes (--show-body prints it)\n", v.PayloadBytes)
		}
	})
}

func deadViews(dead []outbox.DeadEvent) []eventView {
	views := []eventView{}
	for _, d := range dead {
		views = append(views, eventView{ID: d.ID.String(), Topic: d.Topic, OrderingKey: d.OrderingKey, State: outbox.StateDead,
			Attempts: d.Attempts, CreatedAt: d.CreatedAt, LastError: d.LastError, PayloadBytes: len(d.Payload)})
	}
	return views
}

func (a *app) outboxDead(topic string, limit int) error {
	if limit <= 0 || limit > maxListLimit {
		return usageError{fmt.Sprintf("--limit %d: give 1 to %d", limit, maxListLimit)}
	}
	out, err := a.outbox()
	if err != nil {
		return err
	}
	dead, err := out.ListDead(a.ctx, &outbox.DeadOpts{Topic: topic, Limit: limit})
	if err != nil {
		return err
	}
	views := deadViews(dead)
	return a.emit(views, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "ID\tTOPIC\tATTEMPTS\tCREATED\tLAST ERROR")
		for _, v := range views {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", v.ID, v.Topic, v.Attempts, rfc3339(v.CreatedAt), clip(oneLine(v.LastError), 100))
		}
	})
}

type retryFlags struct {
	topic            string
	all, yes, dryRun bool
	reason, actor    string
}

// retryView is what outbox retry prints.
type retryView struct {
	DryRun  bool     `json:"dry_run"`
	Retried []string `json:"retried"`
	// WouldRetry lists the events a dry run would retry.
	WouldRetry []string `json:"would_retry"`
}

func (a *app) outboxRetry(args []string, rt retryFlags) error {
	chosen := 0
	for _, set := range []bool{len(args) > 0, rt.topic != "", rt.all} {
		if set {
			chosen++
		}
	}
	if chosen != 1 {
		return usageError{"outbox retry takes event IDs, or --topic, or --all: one of them (oncekit outbox dead lists the dead events)"}
	}
	if rt.yes && rt.dryRun {
		return usageError{"--yes and --dry-run contradict each other: give one"}
	}
	if len(args) > outbox.MaxRetryDead {
		return usageError{fmt.Sprintf("at most %d IDs at once", outbox.MaxRetryDead)}
	}
	acts := !rt.dryRun && (len(args) > 0 || rt.yes)
	if acts && rt.reason == "" {
		return usageError{"outbox retry needs --reason: say why, such as the incident's reference; it is kept in the audit rows"}
	}
	if len(rt.reason) > ledger.MaxReasonLen || len(rt.actor) > ledger.MaxActorLen {
		return usageError{fmt.Sprintf("--reason and --actor are at most %d and %d bytes", ledger.MaxReasonLen, ledger.MaxActorLen)}
	}
	opts := &outbox.RetryDeadOpts{Topic: rt.topic, All: rt.all, Actor: rt.actor, Reason: rt.reason}
	for _, arg := range args {
		id, err := parseEventID(arg)
		if err != nil {
			return err
		}
		opts.IDs = append(opts.IDs, id)
	}
	out, err := a.outbox()
	if err != nil {
		return err
	}
	rv := retryView{DryRun: !acts, Retried: []string{}, WouldRetry: []string{}}
	if rv.DryRun {
		var dead []outbox.DeadEvent
		if len(opts.IDs) > 0 {
			if dead, err = a.deadByID(out, opts.IDs); err != nil {
				return err
			}
		} else {
			dead, err = out.ListDead(a.ctx, &outbox.DeadOpts{Topic: rt.topic, Limit: outbox.MaxRetryDead + 1})
			if err != nil {
				return err
			}
			if len(dead) > outbox.MaxRetryDead {
				return exitError{exitRefused, fmt.Sprintf("more than %d dead events match, more than one retry takes: retry them by --topic or by ID, in parts", outbox.MaxRetryDead)}
			}
		}
		for _, d := range dead {
			rv.WouldRetry = append(rv.WouldRetry, d.ID.String())
		}
		if err := a.emit(rv, func(w *tabwriter.Writer) {
			for _, d := range deadViews(dead) {
				fmt.Fprintf(w, "would retry\t%s\t%s\t%d attempts\t%s\n", d.ID, d.Topic, d.Attempts, clip(oneLine(d.LastError), 100))
			}
		}); err != nil {
			return err
		}
		switch {
		case len(dead) == 0:
			return exitError{exitNotFound, "no dead event matches"}
		case rt.dryRun:
			return nil
		}
		return exitError{exitRefused, fmt.Sprintf("nothing retried: run again with %s to retry %s", missingToAct(rt.reason != ""), plural(len(dead), "event"))}
	}
	ids, err := out.RetryDead(a.ctx, opts)
	var nd *outbox.NotDeadError
	if errors.As(err, &nd) {
		return notDeadExit(nd)
	}
	if err != nil {
		return err
	}
	for _, id := range ids {
		rv.Retried = append(rv.Retried, id.String())
	}
	return a.emit(rv, func(w *tabwriter.Writer) {
		for _, id := range rv.Retried {
			fmt.Fprintf(w, "retrying\t%s\n", id)
		}
		if len(rv.Retried) == 0 {
			fmt.Fprintln(w, "no dead event matched: nothing retried")
		} else {
			fmt.Fprintf(w, "audited\t%s by %s: %q\n", plural(len(rv.Retried), "retry"), rt.actor, rt.reason)
		}
	})
}

// deadByID returns the events of ids, which must all be dead, as a retry's dry run
// shows them; an event that is missing or not dead ends it as the retry would.
func (a *app) deadByID(out *outbox.Outbox, ids []uuid.UUID) ([]outbox.DeadEvent, error) {
	nd := &outbox.NotDeadError{}
	var dead []outbox.DeadEvent
	for _, id := range ids {
		e, err := out.Get(a.ctx, id)
		switch {
		case errors.Is(err, outbox.ErrEventNotFound):
			nd.Count++
			nd.IDs = append(nd.IDs, id)
			nd.MissingCount++
			nd.Missing = append(nd.Missing, id)
		case err != nil:
			return nil, err
		case e.State != outbox.StateDead:
			nd.Count++
			nd.IDs = append(nd.IDs, id)
		default:
			dead = append(dead, outbox.DeadEvent{Event: e.Event, LastError: e.LastError})
		}
	}
	if nd.Count > 0 {
		return nil, notDeadExit(nd)
	}
	return dead, nil
}

// notDeadExit says which events a retry refused: "no such event" (exit 3) when none of
// them exists, "not dead" (exit 6) otherwise.
func notDeadExit(nd *outbox.NotDeadError) error {
	ids := func(list []uuid.UUID, count int) string {
		s := make([]string, len(list))
		for i, id := range list {
			s[i] = id.String()
		}
		if count > len(list) {
			return strings.Join(s, ", ") + fmt.Sprintf(" and %d more", count-len(list))
		}
		return strings.Join(s, ", ")
	}
	missing := ids(nd.Missing, nd.MissingCount)
	if nd.MissingCount == nd.Count {
		return exitError{exitNotFound, fmt.Sprintf("no such event: %s (published events are purged after their retention); nothing was retried", missing)}
	}
	var notDead []uuid.UUID
	for _, id := range nd.IDs {
		if !slices.Contains(nd.Missing, id) {
			notDead = append(notDead, id)
		}
	}
	n := nd.Count - nd.MissingCount
	verb := "are"
	if n == 1 {
		verb = "is"
	}
	msg := fmt.Sprintf("%s %s not dead: %s", plural(n, "event"), verb, ids(notDead, n))
	if nd.MissingCount > 0 {
		msg += fmt.Sprintf("; no such event: %s", missing)
	}
	return exitError{exitWrongState, msg + "; nothing was retried (only a dead event is retried: oncekit outbox dead lists them, oncekit outbox inspect ID shows one)"}
}

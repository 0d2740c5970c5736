package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/inbox"
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
		Use:   "outbox",
		Short: "Inspect the outbox's events, list and retry dead ones, purge published ones",
		Args:  args(0, ""),
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return usageError{"outbox needs a subcommand: inspect, dead, retry or purge"}
		}),
	}
	var showBody bool
	inspect := &cobra.Command{
		Use:   "inspect ID",
		Short: "Show one event: state, attempts, last error, trace",
		Args:  args(1, "an event ID"),
		RunE:  a.runE(func(_ *cobra.Command, args []string) error { return a.outboxInspect(args[0], showBody) }),
	}
	inspect.Flags().BoolVar(&showBody, "show-body", false, "print the payload (it may hold customer data); without it, its size")

	var topic string
	var limit int
	dead := &cobra.Command{
		Use:   "dead",
		Short: "List dead events, oldest first",
		Long:  "outbox dead lists the events that kept failing and are no longer published, oldest first, with their last error.",
		Args:  args(0, ""),
		RunE:  a.runE(func(*cobra.Command, []string) error { return a.outboxDead(topic, limit) }),
	}
	dead.Flags().StringVar(&topic, "topic", "", "only this topic's events")
	dead.Flags().IntVar(&limit, "limit", outbox.DeadLimitDefault, fmt.Sprintf("at most this many events, 1 to %d", maxListLimit))

	var rt retryFlags
	retry := &cobra.Command{
		Use:   "retry [ID...]",
		Short: "Make dead events pending again: by ID, by --topic, or --all; all or nothing",
		Long: `outbox retry makes dead events pending again, attempts reset, so dispatchers publish
them. It retries the IDs given, or every dead event of --topic, or with --all every dead
event, in one transaction: if one of the IDs is not dead, none is retried. --topic and
--all show what they would retry and change nothing without --yes.`,
		RunE: a.runE(func(_ *cobra.Command, args []string) error { return a.outboxRetry(args, rt) }),
	}
	retry.Flags().StringVar(&rt.topic, "topic", "", "retry every dead event of this topic")
	retry.Flags().BoolVar(&rt.all, "all", false, "retry every dead event")
	retry.Flags().BoolVarP(&rt.yes, "yes", "y", false, "with --topic or --all: retry; without it, show what would be retried")

	var p purgeFlags
	purge := &cobra.Command{
		Use:   "purge",
		Short: "Delete events published longer ago than --published-retention, in batches",
		Long:  "outbox purge deletes published events older than --published-retention, in batches; without --yes it counts them. Pending and dead events are never purged.",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			if err := p.check(); err != nil {
				return err
			}
			out, err := a.outbox()
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
	topic    string
	all, yes bool
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
	if len(args) > outbox.MaxRetryDead {
		return usageError{fmt.Sprintf("at most %d IDs at once", outbox.MaxRetryDead)}
	}
	opts := &outbox.RetryDeadOpts{Topic: rt.topic, All: rt.all}
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
	rv := retryView{DryRun: len(args) == 0 && !rt.yes, Retried: []string{}, WouldRetry: []string{}}
	if rv.DryRun {
		dead, err := out.ListDead(a.ctx, &outbox.DeadOpts{Topic: rt.topic, Limit: outbox.MaxRetryDead + 1})
		if err != nil {
			return err
		}
		if len(dead) > outbox.MaxRetryDead {
			return exitError{exitRefused, fmt.Sprintf("more than %d dead events match, more than one retry takes: retry them by --topic or by ID, in parts", outbox.MaxRetryDead)}
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
		if len(dead) == 0 {
			return exitError{exitNotFound, "no dead event matches"}
		}
		return exitError{exitRefused, fmt.Sprintf("nothing retried: run again with --yes (-y) to retry %s", plural(len(dead), "event"))}
	}
	ids, err := out.RetryDead(a.ctx, opts)
	var nd *outbox.NotDeadError
	if errors.As(err, &nd) {
		return exitError{exitNotFound, fmt.Sprintf("%s; oncekit outbox dead lists the dead ones", oneLine(strings.TrimPrefix(nd.Error(), "oncekit/outbox: ")))}
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
		}
	})
}

func (a *app) inboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Count the inbox's records by subscriber, purge expired ones",
		Args:  args(0, ""),
		RunE:  a.runE(func(*cobra.Command, []string) error { return usageError{"inbox needs a subcommand: status or purge"} }),
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Count each subscriber's records: processed, rejected, expired, last received",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			in, err := a.inbox()
			if err != nil {
				return err
			}
			st, err := in.Stats(a.ctx)
			if err != nil {
				return err
			}
			views := subscribers(st)
			return a.emit(views, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "SUBSCRIBER\tPROCESSED\tREJECTED\tEXPIRED\tLAST RECEIVED")
				for _, v := range views {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\n", v.Subscriber, v.Processed, v.Rejected, v.Expired, rfc3339(v.LastReceived))
				}
			})
		}),
	}
	var p purgeFlags
	purge := &cobra.Command{
		Use:   "purge",
		Short: "Delete expired inbox records, in batches",
		Long:  "inbox purge deletes the records past their retention, in batches; without --yes it counts them. An expired record already counts as absent.",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			if err := p.check(); err != nil {
				return err
			}
			in, err := a.inbox()
			if err != nil {
				return err
			}
			return a.purge(p, []purgeStep{inboxPurge(a, in, p)})
		}),
	}
	p.register(purge, false)
	cmd.AddCommand(status, purge)
	return cmd
}

func (a *app) inbox() (*inbox.Inbox, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	return inbox.New(a.pool, &inbox.Config{Schema: a.schema})
}

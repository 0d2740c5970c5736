package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
)

func (a *app) inboxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use: "inbox",
		Example: `  oncekit inbox status
  oncekit inbox show billing msg-8f14e45f`,
		Short: "Count the inbox's records by subscriber, purge expired ones",
		Args:  args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			return usageError{"inbox needs a subcommand: status, show or purge"}
		}),
	}
	show := &cobra.Command{
		Use:   "show SUBSCRIBER MESSAGE-ID",
		Short: "Show whether a subscriber recorded a message: processed, rejected (and why), when, until when",
		Long: `inbox show looks up the record SUBSCRIBER keeps of the message MESSAGE-ID (the ID the
consumer passed to Inbox.Handle, such as the broker's message ID): processed, or rejected
for good with its reason; when it was received; when it expires, after which a
redelivery is handled again. No record means the message was never handled, or its
handler failed (which leaves none: the broker redelivers it), or its record expired and
was purged.`,
		Example: `  oncekit inbox show billing msg-8f14e45f
  oncekit inbox show billing msg-8f14e45f --json`,
		Args: args(2, "SUBSCRIBER MESSAGE-ID"),
		RunE: a.runE(func(_ *cobra.Command, args []string) error { return a.inboxShow(args[0], args[1]) }),
	}
	status := &cobra.Command{
		Use: "status",
		Example: `  oncekit inbox status
  oncekit inbox status --json`,
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
		Use: "purge",
		Example: `  oncekit inbox purge --dry-run
  oncekit inbox purge -y --batch 1000 --pause 0`,
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
	cmd.AddCommand(status, show, purge)
	return cmd
}

func (a *app) inbox() (*inbox.Inbox, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	return inbox.New(a.pool, &inbox.Config{Schema: a.schema})
}

// messageView is an inbox record as the command shows it.
type messageView struct {
	Subscriber string    `json:"subscriber"`
	MessageID  string    `json:"message_id"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Expired    bool      `json:"expired"`
}

func (a *app) inboxShow(subscriber, messageID string) error {
	if err := (keys.Scope{Tenant: subscriber, Operation: "inbox"}).Validate(); err != nil {
		return usageError{fmt.Sprintf("%q is not a subscriber name: %v", bounded(subscriber), err)}
	}
	if err := keys.Key(messageID).Validate(); err != nil {
		return usageError{fmt.Sprintf("%q is not a message ID: %v", bounded(messageID), err)}
	}
	in, err := a.inbox()
	if err != nil {
		return err
	}
	r, err := in.Get(a.ctx, subscriber, messageID)
	if errors.Is(err, inbox.ErrNotFound) {
		return exitError{exitNotFound, fmt.Sprintf("no record of message %q for subscriber %q: it was never handled, or its handler failed (which leaves no record, and the broker redelivers it), or its record expired and was purged (oncekit inbox status counts each subscriber's records)",
			messageID, subscriber)}
	}
	if err != nil {
		return err
	}
	v := messageView{Subscriber: r.Subscriber, MessageID: r.MessageID, State: r.State, Error: r.Error, ReceivedAt: r.ReceivedAt,
		ExpiresAt: r.ExpiresAt, Expired: r.Expired}
	now := a.dbNow()
	return a.emit(v, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "subscriber\t%s\nmessage id\t%s\n", v.Subscriber, v.MessageID)
		switch v.State {
		case "rejected":
			fmt.Fprintf(w, "state\trejected for good: %s\n", oneLine(v.Error))
		default:
			fmt.Fprintf(w, "state\t%s: a redelivery is a duplicate, and is not handled again\n", v.State)
		}
		fmt.Fprintf(w, "received\t%s (%s)\n", rfc3339(v.ReceivedAt), ago(v.ReceivedAt, now))
		expires := rfc3339(v.ExpiresAt)
		if v.Expired {
			expires += " (expired " + ago(v.ExpiresAt, now) + ": counts as absent, and a redelivery would be handled again)"
		}
		fmt.Fprintf(w, "expires\t%s\n", expires)
	})
}

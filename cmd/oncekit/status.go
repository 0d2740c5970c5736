package main

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use: "status",
		Example: `  oncekit status
  oncekit status --json
  oncekit status --shard-url eu=postgres://eu-db/app --shard-url us=postgres://us-db/app`,
		Short: "Schema version, records by state, stuck and expired records, outbox and inbox",
		Long: `status counts what the schema holds: the ledger's records by state and operation, the
oldest pending record, the pending records whose lease ran out (stuck) and the expired
records a purge deletes; the outbox's events by state; the inbox's records.`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error { return a.status() }),
	}
}

// statusView is what status prints.
type statusView struct {
	Schema        string                            `json:"schema"`
	Migrations    map[string]int                    `json:"migrations"`
	Records       map[ledger.State]map[string]int64 `json:"records"`
	OldestPending *time.Time                        `json:"oldest_pending"`
	Stuck         int64                             `json:"stuck"`
	Expired       int64                             `json:"expired"`
	Purgeable     int64                             `json:"purgeable"`
	Outbox        outboxCounts                      `json:"outbox"`
	Inbox         []subscriberView                  `json:"inbox"`
}

type outboxCounts struct {
	Pending   int `json:"pending"`
	Published int `json:"published"`
	Dead      int `json:"dead"`
}

type subscriberView struct {
	Subscriber   string    `json:"subscriber"`
	Processed    int64     `json:"processed"`
	Rejected     int64     `json:"rejected"`
	Expired      int64     `json:"expired"`
	LastReceived time.Time `json:"last_received"`
}

func subscribers(stats []inbox.SubscriberStats) []subscriberView {
	out := []subscriberView{}
	for _, s := range stats {
		out = append(out, subscriberView{Subscriber: s.Subscriber, Processed: s.Processed, Rejected: s.Rejected, Expired: s.Expired, LastReceived: s.LastReceived})
	}
	return out
}

func (a *app) status() error {
	l, err := a.ledger()
	if err != nil {
		return err
	}
	sv := statusView{Schema: a.schema, Records: map[ledger.State]map[string]int64{}}
	if sv.Migrations, err = migrate.Versions(a.ctx, a.pool, a.schema); err != nil {
		return err
	}
	st, err := l.Stats(a.ctx)
	if err != nil {
		return err
	}
	for _, s := range []ledger.State{ledger.StatePending, ledger.StateCompleted, ledger.StateFailed} {
		sv.Records[s] = st.ByState[s]
		if sv.Records[s] == nil {
			sv.Records[s] = map[string]int64{}
		}
	}
	sv.Stuck, sv.Expired, sv.Purgeable = st.Stuck, st.Expired, st.Purgeable
	if !st.OldestPending.IsZero() {
		sv.OldestPending = &st.OldestPending
	}
	out, err := outbox.New(a.pool, &outbox.Config{Schema: a.schema})
	if err != nil {
		return err
	}
	ostats, err := out.Stats(a.ctx)
	if err != nil {
		return err
	}
	sv.Outbox = outboxCounts(ostats)
	in, err := inbox.New(a.pool, &inbox.Config{Schema: a.schema})
	if err != nil {
		return err
	}
	ist, err := in.Stats(a.ctx)
	if err != nil {
		return err
	}
	sv.Inbox = subscribers(ist)
	now := a.dbNow()
	return a.emit(sv, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "schema\t%s\n", sv.Schema)
		var lines []string
		for _, line := range []string{"ledger", "webhook", "inbox", "outbox"} {
			lines = append(lines, fmt.Sprintf("%s %d", line, sv.Migrations[line]))
		}
		fmt.Fprintf(w, "migrations\t%s\n", strings.Join(lines, ", "))
		fmt.Fprintln(w, "\nSTATE\tOPERATION\tRECORDS")
		for _, state := range []ledger.State{ledger.StatePending, ledger.StateCompleted, ledger.StateFailed} {
			ops := make([]string, 0, len(sv.Records[state]))
			for op := range sv.Records[state] {
				ops = append(ops, op)
			}
			slices.Sort(ops)
			for _, op := range ops {
				fmt.Fprintf(w, "%s\t%s\t%d\n", state, op, sv.Records[state][op])
			}
		}
		fmt.Fprintln(w)
		oldest := "-"
		if sv.OldestPending != nil {
			oldest = rfc3339(*sv.OldestPending) + " (" + ago(*sv.OldestPending, now) + ")"
		}
		fmt.Fprintf(w, "oldest pending\t%s\n", oldest)
		fmt.Fprintf(w, "stuck (lease ran out)\t%d\n", sv.Stuck)
		fmt.Fprintf(w, "expired\t%d (%d for oncekit purge)\n", sv.Expired, sv.Purgeable)
		fmt.Fprintf(w, "outbox\t%d pending, %d published, %d dead\n", sv.Outbox.Pending, sv.Outbox.Published, sv.Outbox.Dead)
		var processed, expired int64
		for _, s := range sv.Inbox {
			processed += s.Processed + s.Rejected
			expired += s.Expired
		}
		fmt.Fprintf(w, "inbox\t%d records of %d subscribers, %d expired\n", processed, len(sv.Inbox), expired)
	})
}

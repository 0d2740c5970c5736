package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// purgeFlags are the flags of the purges.
type purgeFlags struct {
	batch     int
	pause     time.Duration
	retention time.Duration
	yes       bool
	dryRun    bool
}

func (p *purgeFlags) register(cmd *cobra.Command, outboxToo bool) {
	cmd.Flags().IntVar(&p.batch, "batch", ledger.PurgeBatchDefault, "rows per statement, which bounds how long each holds its locks")
	cmd.Flags().DurationVar(&p.pause, "pause", ledger.PurgePauseDefault, "wait this long between two statements, to leave the database to the traffic beside the purge (0: no pause)")
	if outboxToo {
		cmd.Flags().DurationVar(&p.retention, "published-retention", outbox.PublishedRetentionDefault, "keep published outbox events this long")
	}
	cmd.Flags().BoolVarP(&p.yes, "yes", "y", false, "delete; without it, count what would be deleted")
	cmd.Flags().BoolVar(&p.dryRun, "dry-run", false, "count what would be deleted and delete nothing, as without --yes, and exit 0")
}

func (p *purgeFlags) check() error {
	if p.yes && p.dryRun {
		return usageError{"--yes and --dry-run contradict each other: give one"}
	}
	if p.batch <= 0 {
		return usageError{"--batch must be positive"}
	}
	if p.retention < 0 {
		return usageError{"--published-retention must not be negative"}
	}
	if p.pause < 0 {
		return usageError{"--pause must not be negative"}
	}
	return nil
}

// purgeTable is what a purge would delete, or deleted, from one table.
type purgeTable struct {
	Table   string `json:"table"`
	What    string `json:"what"`
	Count   int64  `json:"count"`
	Batches int    `json:"batches"`
}

// purgeView is what the purges print.
type purgeView struct {
	DryRun bool         `json:"dry_run"`
	Tables []purgeTable `json:"tables"`
}

// purgeStep counts or purges one table.
type purgeStep struct {
	table, what string
	count       func() (int64, error)
	purge       func() (int64, int, error)
}

func (a *app) purgeCommand() *cobra.Command {
	var p purgeFlags
	cmd := &cobra.Command{
		Use: "purge",
		Example: `  oncekit purge --dry-run
  oncekit purge -y
  oncekit purge -y --batch 1000 --pause 0`,
		Short: "Delete expired records, expired inbox records, old published events and expired agent calls, in batches",
		Long: `purge deletes, in batches, what has outlived its retention: the ledger's expired records
(idempotency_records; a pending record whose lease is live is kept), the agent's expired
frozen tool calls (agent_calls, when the agent's migration line is applied), the inbox's
expired records (inbox_messages), and the outbox's events published longer ago than
--published-retention (outbox_events). Without --yes it counts them and deletes nothing.
Expired records already count as absent: purging only frees space.`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error {
			if err := p.check(); err != nil {
				return err
			}
			if err := a.connect(); err != nil {
				return err
			}
			l, err := ledger.New(a.pool, &ledger.Config{Schema: a.schema})
			if err != nil {
				return err
			}
			in, err := inbox.New(a.pool, &inbox.Config{Schema: a.schema})
			if err != nil {
				return err
			}
			out, err := outbox.New(a.pool, &outbox.Config{Schema: a.schema, PublishedRetention: p.retention})
			if err != nil {
				return err
			}
			agentSteps, err := a.agentPurge(l, p)
			if err != nil {
				return err
			}
			steps := append(append([]purgeStep{a.ledgerPurge(l, p)}, agentSteps...), inboxPurge(a, in, p), outboxPurge(a, out, p))
			return a.purge(p, steps)
		}),
	}
	p.register(cmd, true)
	return cmd
}

// opts are the purges' options: --pause 0 purges without pausing.
func (p purgeFlags) opts() *ledger.PurgeOpts {
	o := &ledger.PurgeOpts{BatchSize: p.batch, Pause: p.pause}
	if p.pause == 0 {
		o.Pause = ledger.NoPause
	}
	return o
}

func (a *app) ledgerPurge(l *ledger.Ledger, p purgeFlags) purgeStep {
	return purgeStep{table: "idempotency_records", what: "expired records",
		count: func() (int64, error) {
			st, err := l.Stats(a.ctx)
			return st.Purgeable, err
		},
		purge: func() (int64, int, error) {
			res, err := l.Purge(a.ctx, p.opts())
			return res.Deleted, res.Batches, err
		}}
}

func inboxPurge(a *app, in *inbox.Inbox, p purgeFlags) purgeStep {
	return purgeStep{table: "inbox_messages", what: "expired inbox records",
		count: func() (int64, error) {
			st, err := in.Stats(a.ctx)
			var n int64
			for _, s := range st {
				n += s.Expired
			}
			return n, err
		},
		purge: func() (int64, int, error) {
			res, err := in.Purge(a.ctx, p.opts())
			return res.Deleted, res.Batches, err
		}}
}

// outboxPurge purges out, whose Config.PublishedRetention is p.retention.
func outboxPurge(a *app, out *outbox.Outbox, p purgeFlags) purgeStep {
	return purgeStep{table: "outbox_events", what: fmt.Sprintf("events published over %s ago", shortDuration(p.retention)),
		count: func() (int64, error) { return out.Purgeable(a.ctx) },
		purge: func() (int64, int, error) {
			res, err := out.Purge(a.ctx, p.opts())
			return res.Deleted, res.Batches, err
		}}
}

func (a *app) purge(p purgeFlags, steps []purgeStep) error {
	pv := purgeView{DryRun: !p.yes, Tables: []purgeTable{}}
	var total int64
	for _, s := range steps {
		t := purgeTable{Table: a.schema + "." + s.table, What: s.what}
		var err error
		if p.yes {
			t.Count, t.Batches, err = s.purge()
		} else {
			t.Count, err = s.count()
		}
		if err != nil {
			return err
		}
		total += t.Count
		pv.Tables = append(pv.Tables, t)
	}
	err := a.emit(pv, func(w *tabwriter.Writer) {
		for _, t := range pv.Tables {
			if pv.DryRun {
				fmt.Fprintf(w, "would purge\t%s\t%d %s\n", t.Table, t.Count, t.What)
			} else {
				fmt.Fprintf(w, "purged\t%s\t%d %s in %s\n", t.Table, t.Count, t.What, plural(t.Batches, "batch"))
			}
		}
	})
	if err == nil && pv.DryRun && total > 0 && !p.dryRun {
		return exitError{exitRefused, "nothing deleted: run again with --yes (-y) to purge"}
	}
	return err
}

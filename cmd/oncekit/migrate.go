package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/migrate"
)

func (a *app) migrateCommand() *cobra.Command {
	var print bool
	cmd := &cobra.Command{
		Use: "migrate",
		Example: `  oncekit migrate
  oncekit migrate --schema billing_oncekit
  oncekit migrate --print`,
		Short: "Apply every migration line (--print: the SQL, for another tool)",
		Long: `migrate creates the schema if needed and applies every migration line's pending files
(ledger, webhook, inbox, outbox), each in its own transaction; many processes may run it at
once. A schema a newer oncekit migrated is refused. --print prints the same as one plain SQL
script, safe to run more than once, for psql or another migration tool.`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error { return a.migrate(print) }),
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the SQL instead of applying it")
	cmd.AddCommand(&cobra.Command{
		Use: "status",
		Example: `  oncekit migrate status
  oncekit migrate status --json`,
		Short: "List each migration line's applied and pending files",
		Long: `migrate status lists, for each migration line, the files the schema applied (and when)
and the files it lacks, which migrate applies, and any file a newer oncekit applied that
this build does not know. It exits 7 when files are pending and 5 when the schema is
ahead of this build, so a deploy script can tell them apart.`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error { return a.migrateStatus() }),
	})
	return cmd
}

// appliedView is a migration file as migrate and migrate status show it.
type appliedView struct {
	Line      string     `json:"line"`
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func (a *app) migrate(print bool) error {
	if print {
		script, err := migrate.Script(a.schema)
		if err != nil {
			return err
		}
		_, err = io.WriteString(a.out, script)
		return err
	}
	if err := a.open(); err != nil {
		return err
	}
	status, err := migrate.Status(a.ctx, a.pool, a.schema)
	if err != nil {
		return err
	}
	if err := migrate.Check(a.schema, status); err != nil {
		return exitError{exitSchema, fmt.Sprintf("%v; this is oncekit %s, which would not know what they did", err, commandVersion())}
	}
	res, err := migrate.Up(a.ctx, a.pool, a.schema)
	if err != nil {
		return err
	}
	applied := []appliedView{}
	for _, m := range res.Applied {
		applied = append(applied, appliedView{Line: m.Line, Version: m.Version, Name: m.Name})
	}
	return a.emit(map[string]any{"schema": a.schema, "applied": applied}, func(w *tabwriter.Writer) {
		if len(applied) == 0 {
			fmt.Fprintf(w, "schema %s is current\n", a.schema)
		}
		for _, m := range applied {
			fmt.Fprintf(w, "applied\t%s/%03d_%s\n", m.Line, m.Version, m.Name)
		}
	})
}

// lineView is a migration line as migrate status shows it.
type lineView struct {
	Line    string        `json:"line"`
	Applied []appliedView `json:"applied"`
	Pending []appliedView `json:"pending"`
	Ahead   []appliedView `json:"ahead"`
}

func views(ms []migrate.Migration) []appliedView {
	out := []appliedView{}
	for _, m := range ms {
		v := appliedView{Line: m.Line, Version: m.Version, Name: m.Name}
		if !m.AppliedAt.IsZero() {
			at := m.AppliedAt
			v.AppliedAt = &at
		}
		out = append(out, v)
	}
	return out
}

func (a *app) migrateStatus() error {
	if err := a.open(); err != nil {
		return err
	}
	status, err := migrate.Status(a.ctx, a.pool, a.schema)
	if err != nil {
		return err
	}
	lines := []lineView{}
	pending, ahead := 0, 0
	for _, st := range status {
		lines = append(lines, lineView{Line: st.Line, Applied: views(st.Applied), Pending: views(st.Pending), Ahead: views(st.Ahead)})
		pending += len(st.Pending)
		ahead += len(st.Ahead)
	}
	err = a.emit(map[string]any{"schema": a.schema, "lines": lines}, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "LINE\tMIGRATION\tSTATE")
		for _, l := range lines {
			for _, m := range l.Applied {
				fmt.Fprintf(w, "%s\t%03d_%s\tapplied %s\n", l.Line, m.Version, m.Name, rfc3339(*m.AppliedAt))
			}
			for _, m := range l.Pending {
				fmt.Fprintf(w, "%s\t%03d_%s\tpending: oncekit migrate applies it\n", l.Line, m.Version, m.Name)
			}
			for _, m := range l.Ahead {
				fmt.Fprintf(w, "%s\t%03d_%s\tapplied %s by a newer oncekit: unknown to this build\n", l.Line, m.Version, m.Name, rfc3339(*m.AppliedAt))
			}
		}
	})
	if err != nil {
		return err
	}
	if ahead > 0 {
		return exitError{exitSchema, fmt.Sprintf("schema %q is ahead of this build (oncekit %s): use the oncekit that migrated it", a.schema, commandVersion())}
	}
	if pending > 0 {
		return exitError{exitPending, fmt.Sprintf("%s pending: run `oncekit migrate`", plural(pending, "migration"))}
	}
	return nil
}

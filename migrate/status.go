package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// Migration is one migration file of a line, as a schema has it.
type Migration struct {
	Line    string
	Version int
	Name    string
	// AppliedAt is when the schema applied it; zero for one not applied.
	AppliedAt time.Time
}

// LineStatus is where a schema stands on one migration line.
type LineStatus struct {
	Line string
	// Applied lists the files of the line this build knows that the schema applied.
	Applied []Migration
	// Pending lists the files of the line this build knows that the schema lacks: Up
	// applies them.
	Pending []Migration
	// Ahead lists what the schema applied that this build does not know: files of a
	// newer version of oncekit, or a line it does not have.
	Ahead []Migration
}

// ErrSchemaAhead: a schema applied migrations this build of oncekit does not know.
var ErrSchemaAhead = errors.New("oncekit/migrate: the schema is ahead of this build of oncekit")

// SchemaAheadError reports the migrations a schema applied that this build does not
// know: a newer oncekit migrated it. Code built on this version may misread its tables.
type SchemaAheadError struct {
	Schema string
	Ahead  []Migration
}

func (e *SchemaAheadError) Error() string {
	names := make([]string, 0, min(len(e.Ahead), 5))
	for _, m := range e.Ahead[:min(len(e.Ahead), 5)] {
		names = append(names, fmt.Sprintf("%s/%03d_%s", m.Line, m.Version, m.Name))
	}
	if len(e.Ahead) > 5 {
		names = append(names, fmt.Sprintf("and %d more", len(e.Ahead)-5))
	}
	return fmt.Sprintf("oncekit/migrate: schema %q has migrations this build of oncekit does not know (%s): a newer oncekit migrated it; use that version",
		e.Schema, strings.Join(names, ", "))
}

// Is matches [ErrSchemaAhead].
func (e *SchemaAheadError) Is(target error) bool { return target == ErrSchemaAhead }

// Status returns where schema (default ledger.SchemaDefault) stands on every migration
// line this build knows, in the order Up applies them, followed by any line the schema
// has that this build does not know. A schema without oncekit's migrations table has
// every file pending. [Check] turns a schema that is ahead into an error.
func Status(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) ([]LineStatus, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	applied := map[string]map[int]Migration{}
	var exists bool
	rows, err := q.Query(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, "oncekit_migrations"}.Sanitize())
	if err == nil {
		exists, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	}
	if err != nil {
		return nil, fmt.Errorf("oncekit/migrate: status of schema %q: %w", schema, err)
	}
	if exists {
		rows, err := q.Query(ctx, "SELECT line, version, name, applied_at FROM "+pgx.Identifier{schema, "oncekit_migrations"}.Sanitize()+
			" WHERE line <> 'legacy' ORDER BY line, version")
		if err != nil {
			return nil, fmt.Errorf("oncekit/migrate: status of schema %q: %w", schema, err)
		}
		ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Migration, error) {
			var m Migration
			return m, r.Scan(&m.Line, &m.Version, &m.Name, &m.AppliedAt)
		})
		if err != nil {
			return nil, fmt.Errorf("oncekit/migrate: status of schema %q: %w", schema, err)
		}
		for _, m := range ms {
			if applied[m.Line] == nil {
				applied[m.Line] = map[int]Migration{}
			}
			applied[m.Line][m.Version] = m
		}
	}
	var out []LineStatus
	known := map[string]bool{}
	for _, l := range lines() {
		known[l.Name] = true
		files, err := l.Load()
		if err != nil {
			return nil, err
		}
		st := LineStatus{Line: l.Name, Applied: []Migration{}, Pending: []Migration{}, Ahead: []Migration{}}
		have := map[int]bool{}
		for _, f := range files {
			have[f.Version] = true
			if m, ok := applied[l.Name][f.Version]; ok {
				st.Applied = append(st.Applied, m)
			} else {
				st.Pending = append(st.Pending, Migration{Line: l.Name, Version: f.Version, Name: f.Name})
			}
		}
		for v, m := range applied[l.Name] {
			if !have[v] {
				st.Ahead = append(st.Ahead, m)
			}
		}
		slices.SortFunc(st.Ahead, func(a, b Migration) int { return a.Version - b.Version })
		out = append(out, st)
	}
	var others []string
	for line := range applied {
		if !known[line] {
			others = append(others, line)
		}
	}
	slices.Sort(others)
	for _, line := range others {
		st := LineStatus{Line: line, Applied: []Migration{}, Pending: []Migration{}, Ahead: []Migration{}}
		for _, m := range applied[line] {
			st.Ahead = append(st.Ahead, m)
		}
		slices.SortFunc(st.Ahead, func(a, b Migration) int { return a.Version - b.Version })
		out = append(out, st)
	}
	return out, nil
}

// Check returns a [*SchemaAheadError] when the status has migrations this build does not
// know, and nil otherwise; pending migrations are no error.
func Check(schema string, status []LineStatus) error {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	var ahead []Migration
	for _, st := range status {
		ahead = append(ahead, st.Ahead...)
	}
	if len(ahead) > 0 {
		return &SchemaAheadError{Schema: schema, Ahead: ahead}
	}
	return nil
}

// Known lists every migration file this build of oncekit knows, line by line in the
// order Up applies them.
func Known() ([]Migration, error) {
	var out []Migration
	for _, l := range lines() {
		files, err := l.Load()
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			out = append(out, Migration{Line: f.Line, Version: f.Version, Name: f.Name})
		}
	}
	return out, nil
}

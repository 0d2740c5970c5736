// Package migrate sets up oncekit's tables in one call. Each feature keeps its own
// migration line next to the code that queries it: the ledger's records, the webhook
// receiver's entity versions, the inbox and the outbox. Up applies them all, in that
// order, recording each file in the schema's oncekit_migrations table; Script gives the
// same as one plain SQL script for psql or another migration tool.
package migrate

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/migrate"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/webhook"
)

// Applied names one migration file that Up applied.
type Applied struct {
	Line    string
	Version int
	Name    string
}

// Result reports what Up did.
type Result struct {
	// Applied lists the files applied by this call; empty when the schema was current.
	Applied []Applied
}

func lines() []migrate.Line {
	return []migrate.Line{
		{Name: ledger.MigrationLine, Files: ledger.Migrations()},
		{Name: webhook.MigrationLine, Files: webhook.Migrations()},
		{Name: inbox.MigrationLine, Files: inbox.Migrations()},
		{Name: outbox.MigrationLine, Files: outbox.Migrations()},
	}
}

// Up creates schema (default ledger.SchemaDefault) if needed and applies every line's
// migrations not yet applied, each in its own transaction. It is safe to call from many
// processes at once: a transaction-scoped advisory lock serialises them. db is a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
func Up(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema string) (Result, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	files, err := migrate.Up(ctx, db, schema, lines()...)
	var res Result
	for _, f := range files {
		res.Applied = append(res.Applied, Applied{Line: f.Line, Version: f.Version, Name: f.Name})
	}
	return res, err
}

// Versions returns the newest applied version of each migration line in schema (default
// ledger.SchemaDefault), such as {"ledger": 2, "outbox": 2}.
func Versions(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) (map[string]int, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	return migrate.Versions(ctx, q, schema)
}

// Script returns every line as one plain SQL script for psql or another migration
// tool: it creates schema (default ledger.SchemaDefault), sets the search_path, and
// applies and records every file. Each file is safe to run more than once, so the script
// is too, and a schema it set up is one that Up finds current.
func Script(schema string) (string, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	return migrate.Script(schema, lines()...)
}

package ledger

import (
	"context"
	"embed"
	"io/fs"

	"github.com/oncekit/oncekit/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the ledger's migration line as plain SQL files named NNN_name.sql,
// for use with another migration tool. Run each with search_path set to oncekit's schema.
// Package migrate applies every feature's line, this one first.
func Migrations() fs.FS { return migrate.Dir(migrationFiles) }

// MigrateResult reports what [Migrate] did.
type MigrateResult struct {
	// Applied lists the versions applied by this call; empty when the schema was current.
	Applied []int
}

// Migrate creates oncekit's schema if needed and applies the ledger's migrations not yet
// applied, each in its own transaction. It is safe to call from many processes at once:
// a transaction-scoped advisory lock serialises them, and each migration is recorded in
// the schema's oncekit_migrations table under the line "ledger". schema defaults to
// [SchemaDefault] when empty. The webhook, inbox and outbox tables have lines of their
// own: migrate.Up applies them all in one call. On a database with the citus extension
// it then distributes the records by tenant, as migrate.Up does.
func Migrate(ctx context.Context, db Beginner, schema string) (MigrateResult, error) {
	if schema == "" {
		schema = SchemaDefault
	}
	files, err := migrate.Up(ctx, db, schema, migrate.Line{Name: MigrationLine, Files: Migrations(),
		Tables: []migrate.Table{{Name: "idempotency_records", Column: "tenant"}}})
	var res MigrateResult
	for _, f := range files {
		res.Applied = append(res.Applied, f.Version)
	}
	return res, err
}

// MigrationLine names the ledger's line in the oncekit_migrations table.
const MigrationLine = "ledger"

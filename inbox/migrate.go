package inbox

import (
	"embed"
	"io/fs"

	"github.com/oncekit/oncekit/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns this package's migration line, [MigrationLine], as plain SQL files named
// NNN_name.sql, for use with another migration tool: run each with search_path set to
// oncekit's schema, after the ledger's line. migrate.Up applies every line in one call.
func Migrations() fs.FS { return migrate.Dir(migrationFiles) }

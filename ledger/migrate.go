package ledger

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the ledger's migrations as plain SQL files named NNN_name.sql, for
// use with another migration tool. Run each with search_path set to the ledger's schema.
func Migrations() fs.FS {
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return sub
}

// migration is one numbered migration file.
type migration struct {
	Version int
	Name    string
	SQL     string
}

func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("oncekit/ledger: migration file %q is not named NNN_name.sql", e.Name())
		}
		b, err := fs.ReadFile(migrationFiles, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{Version: v, Name: name, SQL: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.Version - b.Version })
	return out, nil
}

// MigrateResult reports what [Migrate] did.
type MigrateResult struct {
	// Applied lists the versions applied by this call; empty when the schema was current.
	Applied []int
}

// Migrate creates the ledger's schema if needed and applies every migration not yet
// applied, each in its own transaction. It is safe to call from many processes at once:
// a transaction-scoped advisory lock serialises them, and each migration is recorded in
// the schema's oncekit_migrations table. schema defaults to [SchemaDefault] when empty.
func Migrate(ctx context.Context, db Beginner, schema string) (MigrateResult, error) {
	if schema == "" {
		schema = SchemaDefault
	}
	migs, err := loadMigrations()
	if err != nil {
		return MigrateResult{}, err
	}
	var res MigrateResult
	for _, m := range migs {
		applied, err := applyMigration(ctx, db, schema, m)
		if err != nil {
			return res, fmt.Errorf("oncekit/ledger: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if applied {
			res.Applied = append(res.Applied, m.Version)
		}
	}
	return res, nil
}

func applyMigration(ctx context.Context, db Beginner, schema string, m migration) (applied bool, err error) {
	ident := pgx.Identifier{schema}.Sanitize()
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('oncekit.migrate.' || $1::text, 0))", schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS oncekit_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var done bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM oncekit_migrations WHERE version = $1)", m.Version).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO oncekit_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return err
		}
		applied = true
		return nil
	})
	return applied, err
}

// Package migrate applies oncekit's migration lines: each feature keeps its own
// numbered SQL files beside the code that queries them, and one table records which
// file of which line a schema has.
package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner starts a transaction. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Line is one feature's migrations: files named NNN_name.sql at the root of Files.
type Line struct {
	Name  string
	Files fs.FS
	// Tables says where Citus places the line's tables ([Place]).
	Tables []Table
}

// Dir returns the directory migrations of files: every package embeds its line's
// files as migrations/*.sql, so that a new file joins the line by its name alone.
func Dir(files embed.FS) fs.FS {
	sub, _ := fs.Sub(files, "migrations") // fails only on an invalid path, which this is not
	return sub
}

// File is one migration of a line.
type File struct {
	Line    string
	Version int
	Name    string
	SQL     string
	// NoTx is set for a file whose first line is [NoTxMarker]: its statements run one at
	// a time outside a transaction, for CREATE INDEX CONCURRENTLY.
	NoTx bool
}

// NoTxMarker, as the first line of a migration file, says that the file runs outside a
// transaction, one statement at a time, so that it may build indexes with CREATE INDEX
// CONCURRENTLY while writes go on. Each of its statements ends with a semicolon at the
// end of a line, and none holds a dollar-quoted body. [Up] runs such a file in a
// transaction like any other, with its indexes built plainly, where building them
// concurrently buys nothing or cannot be done: when the tables are new (every earlier
// file of the line was applied by the same call), and when Up was given a transaction.
const NoTxMarker = "-- oncekit:no-transaction"

// Load returns the line's migrations in order.
func (l Line) Load() ([]File, error) {
	entries, err := fs.ReadDir(l.Files, ".")
	if err != nil {
		return nil, err
	}
	var out []File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("oncekit: migration file %s/%q is not named NNN_name.sql", l.Name, e.Name())
		}
		b, err := fs.ReadFile(l.Files, e.Name())
		if err != nil {
			return nil, err
		}
		sql := string(b)
		out = append(out, File{Line: l.Name, Version: v, Name: name, SQL: sql,
			NoTx: strings.HasPrefix(sql, NoTxMarker+"\n") || strings.HasPrefix(sql, NoTxMarker+"\r\n")})
	}
	slices.SortFunc(out, func(a, b File) int { return a.Version - b.Version })
	return out, nil
}

// table records applied files. Versions before lines recorded one version per schema; a
// table of that shape gains the line column, its rows keep the line "legacy", and every
// line's files (all safe to run more than once) are applied and recorded again.
const table = `CREATE TABLE IF NOT EXISTS oncekit_migrations (
	line       text        NOT NULL DEFAULT 'legacy',
	version    integer     NOT NULL,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	CONSTRAINT oncekit_migrations_pkey PRIMARY KEY (line, version));
ALTER TABLE oncekit_migrations ADD COLUMN IF NOT EXISTS line text NOT NULL DEFAULT 'legacy';
DO $$ BEGIN
	IF (SELECT count(*) FROM pg_attribute a JOIN pg_index i ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
	    WHERE i.indrelid = 'oncekit_migrations'::regclass AND i.indisprimary) = 1 THEN
		ALTER TABLE oncekit_migrations DROP CONSTRAINT oncekit_migrations_pkey;
		ALTER TABLE oncekit_migrations ADD CONSTRAINT oncekit_migrations_pkey PRIMARY KEY (line, version);
	END IF;
END $$`

// Up applies, in schema, every file of lines not yet applied, each in its own
// transaction under a transaction-scoped advisory lock, so many processes may call it at
// once. It returns the files it applied.
//
// On a database with the citus extension, Up then places the lines' tables that Citus
// does not hold yet, as [Place] does with no table to colocate with.
func Up(ctx context.Context, db Beginner, schema string, lines ...Line) (_ []File, err error) {
	var applied []File
	defer func() {
		if err == nil {
			_, err = Place(ctx, db, schema, "", lines...)
			if errors.Is(err, ErrNotCitus) {
				err = nil
			}
		}
	}()
	for _, l := range lines {
		files, err := l.Load()
		if err != nil {
			return applied, err
		}
		// fresh: every file of the line so far was applied by this call, so its tables
		// are new.
		fresh := true
		for _, f := range files {
			var ok bool
			var err error
			if f.NoTx && !fresh {
				ok, err = applyOutside(ctx, db, schema, f)
			} else {
				ok, err = apply(ctx, db, schema, f)
			}
			fresh = fresh && ok
			if err != nil {
				return applied, fmt.Errorf("oncekit: migration %s/%03d_%s: %w", f.Line, f.Version, f.Name, err)
			}
			if ok {
				applied = append(applied, f)
			}
		}
	}
	return applied, nil
}

// lockKey is the advisory lock that serialises the migrations of schema.
func lockKey(schema string) string {
	return "hashtextextended('oncekit.migrate.' || " + quote(schema) + ", 0)"
}

// execer runs a statement: a connection or a transaction.
type execer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// errBusy says that another caller holds the migrations' lock.
var errBusy = errors.New("oncekit: migrations' lock is held")

// tryLock takes the migrations' advisory lock of schema through q with lockFunc
// (pg_try_advisory_xact_lock or pg_try_advisory_lock), or returns errBusy.
func tryLock(ctx context.Context, q execer, schema, lockFunc string) error {
	var ok bool
	if err := q.QueryRow(ctx, "SELECT "+lockFunc+"("+lockKey(schema)+")").Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errBusy
	}
	return nil
}

// whenFree runs f, which begins with [tryLock], again after a pause for as long as it
// returns errBusy. A caller never waits for the lock inside a statement nor inside an
// open transaction: CREATE INDEX CONCURRENTLY, run by the lock's holder, waits for every
// transaction that had a snapshot when it began one of its phases, to its end.
func whenFree(ctx context.Context, f func() error) error {
	pause := 5 * time.Millisecond
	for {
		if err := f(); !errors.Is(err, errBusy) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
}

func apply(ctx context.Context, db Beginner, schema string, f File) (applied bool, err error) {
	ident := pgx.Identifier{schema}.Sanitize()
	err = whenFree(ctx, func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := tryLock(ctx, tx, schema, "pg_try_advisory_xact_lock"); err != nil {
				return err
			}
			for _, stmt := range []string{
				"CREATE SCHEMA IF NOT EXISTS " + ident,
				"SET LOCAL search_path TO " + ident,
				table,
			} {
				if _, err := tx.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
					return err
				}
			}
			var done bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM oncekit_migrations WHERE line = $1 AND version = $2)",
				f.Line, f.Version).Scan(&done); err != nil {
				return err
			}
			if done {
				return nil
			}
			if _, err := tx.Exec(ctx, inTx(f), pgx.QueryExecModeSimpleProtocol); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO oncekit_migrations (line, version, name) VALUES ($1, $2, $3)", f.Line, f.Version, f.Name); err != nil {
				return err
			}
			applied = true
			return nil
		})
	})
	return applied, err
}

// inTx is f's SQL as it runs in a transaction: a file marked [NoTxMarker] builds its
// indexes plainly.
func inTx(f File) string {
	if !f.NoTx {
		return f.SQL
	}
	return strings.ReplaceAll(f.SQL, "CREATE INDEX CONCURRENTLY", "CREATE INDEX")
}

// Script returns lines as one plain SQL script for psql or another migration tool: it
// creates schema, sets the search_path, and applies and records every file. Each file is
// safe to run more than once, so the script is too, and a schema set up by it is one
// that Up finds current.
func Script(schema string, lines ...Line) (string, error) {
	var b strings.Builder
	ident := pgx.Identifier{schema}.Sanitize()
	fmt.Fprintf(&b, "-- oncekit schema %s: every migration line. Safe to run more than once.\n", schema)
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\nSET search_path TO %s;\n%s;\n", ident, ident, table)
	for _, l := range lines {
		files, err := l.Load()
		if err != nil {
			return "", err
		}
		for _, f := range files {
			if f.NoTx {
				// A script may run in one transaction, which refuses CREATE INDEX
				// CONCURRENTLY.
				fmt.Fprintf(&b, "\n-- %s/%03d_%s.sql runs outside a transaction under migrate.Up, and builds its indexes\n"+
					"-- concurrently there; here they are built plainly, holding writes to their table back\n"+
					"-- while they build. On a large table, apply that file first, by itself, outside a transaction.", f.Line, f.Version, f.Name)
			}
			fmt.Fprintf(&b, "\n-- %s/%03d_%s.sql\n%s\n", f.Line, f.Version, f.Name, strings.TrimSpace(inTx(f)))
			fmt.Fprintf(&b, "INSERT INTO oncekit_migrations (line, version, name) VALUES (%s, %d, %s) ON CONFLICT DO NOTHING;\n",
				quote(f.Line), f.Version, quote(f.Name))
		}
	}
	return b.String(), nil
}

// quote is a SQL string literal of s.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Versions returns the newest applied version of each line in schema.
func Versions(ctx context.Context, q Querier, schema string) (map[string]int, error) {
	rows, err := q.Query(ctx, "SELECT line, max(version) FROM "+pgx.Identifier{schema, "oncekit_migrations"}.Sanitize()+" GROUP BY line")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var line string
		var v int
		if err := rows.Scan(&line, &v); err != nil {
			return nil, err
		}
		out[line] = v
	}
	return out, rows.Err()
}

package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// applyOutside applies a file marked [NoTxMarker] outside a transaction, one statement
// at a time, on one connection that holds the migrations' session-level advisory lock
// meanwhile. Given a transaction, or a Beginner that offers no connection, it applies
// the file in a transaction with its indexes built plainly.
func applyOutside(ctx context.Context, db Beginner, schema string, f File) (applied bool, err error) {
	var conn *pgx.Conn
	switch c := db.(type) {
	case pgx.Tx:
		return apply(ctx, db, schema, f)
	case *pgx.Conn:
		conn = c
	case *pgxpool.Pool:
		pc, err := c.Acquire(ctx)
		if err != nil {
			return false, err
		}
		defer pc.Release()
		conn = pc.Conn()
	default:
		return apply(ctx, db, schema, f)
	}
	if err := whenFree(ctx, func() error { return tryLock(ctx, conn, schema, "pg_try_advisory_lock") }); err != nil {
		return false, err
	}
	defer func() {
		// Unlocked also when ctx ended: a pooled connection goes back to the pool.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+lockKey(schema)+")"); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	ident := pgx.Identifier{schema}.Sanitize()
	var done bool
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, stmt := range []string{"CREATE SCHEMA IF NOT EXISTS " + ident, "SET LOCAL search_path TO " + ident, table} {
			if _, err := tx.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM oncekit_migrations WHERE line = $1 AND version = $2)",
			f.Line, f.Version).Scan(&done)
	})
	if err != nil || done {
		return false, err
	}
	// The file's statements name tables unqualified: the session's search_path is the
	// schema while they run, and the connection's own afterwards.
	var path string
	if err := conn.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&path); err != nil {
		return false, err
	}
	defer func() {
		if _, rerr := conn.Exec(context.WithoutCancel(ctx), "SELECT set_config('search_path', $1, false)", path); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if _, err := conn.Exec(ctx, "SELECT set_config('search_path', $1, false)", ident); err != nil {
		return false, err
	}
	for _, stmt := range statements(f.SQL) {
		if _, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
			return false, err
		}
	}
	var invalid *string
	if err := conn.QueryRow(ctx, `SELECT string_agg(quote_ident(ic.relname), ', ' ORDER BY ic.relname)
		FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_namespace n ON n.oid = ic.relnamespace
		WHERE n.nspname = $1 AND NOT i.indisvalid`, schema).Scan(&invalid); err != nil {
		return false, err
	}
	if invalid != nil {
		return false, fmt.Errorf("the schema has indexes left INVALID by a build that failed (%s): drop each with DROP INDEX CONCURRENTLY %s.name and run the migration again", *invalid, ident)
	}
	_, err = conn.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "oncekit_migrations"}.Sanitize()+" (line, version, name) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		f.Line, f.Version, f.Name)
	return err == nil, err
}

// statements splits a file marked [NoTxMarker] into its statements: each ends with a
// semicolon at the end of a line that is not a comment.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// Package pgsql holds the SQL mechanics oncekit's PostgreSQL packages share: a
// transaction begun by a one-round-trip script, literal quoting for such scripts, and
// batched deletes that many nodes may run at once.
package pgsql

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// BeginScript begins a transaction on conn by running script (which starts with BEGIN)
// with the simple query protocol, so the statements after BEGIN cost no round trip of
// their own. Their results are discarded; a failing statement is the script's answer,
// returned as the error after the aborted transaction has been rolled back, so conn is
// idle again.
//
// Scripts interpolate values with [QuoteLiteral], which is only safe where the server
// has standard_conforming_strings on; BeginScript refuses any other connection.
func BeginScript(ctx context.Context, conn *pgx.Conn, script string) (pgx.Tx, error) {
	pc := conn.PgConn()
	if pc.ParameterStatus("standard_conforming_strings") != "on" {
		return nil, errors.New("oncekit: the connection must have standard_conforming_strings=on (the PostgreSQL default)")
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: script})
	if err == nil {
		return tx, nil
	}
	if pc.TxStatus() != 'I' {
		if _, rbErr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rbErr != nil {
			return nil, errors.Join(err, rbErr)
		}
	}
	return nil, err
}

// QuoteLiteral quotes s as a SQL string literal. Use it only for values validated as
// printable ASCII (or timestamps) and on connections BeginScript accepts, where
// doubling the quote is the complete escape.
func QuoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Interval is d as a PostgreSQL interval argument, in microseconds. It travels in
// binary, so the server parses no text for it.
func Interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// SQLSTATE codes oncekit acts on, named as in PostgreSQL's errcodes.txt.
const (
	DivisionByZero           = "22012"
	CharacterNotInRepertoire = "22021"
	UntranslatableCharacter  = "22P05"
	UniqueViolation          = "23505"
	CheckViolation           = "23514"
	InFailedSQLTransaction   = "25P02"
	SerializationFailure     = "40001"
	LockNotAvailable         = "55P03"
)

// Code returns err's SQLSTATE, or "" when err is not from PostgreSQL.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsUniqueViolation reports whether err is a unique violation of the named constraint.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == UniqueViolation && pgErr.ConstraintName == constraint
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// PurgeSQL is the one statement every purge runs: it deletes at most $1 rows of table
// (schema-qualified and quoted) matching where, in order, picked FOR UPDATE SKIP LOCKED
// so that concurrent purgers share the work. where and order refer to the purge's own
// arguments as $2 onwards.
func PurgeSQL(table, where, order string) string {
	return `DELETE FROM ` + table + ` WHERE ctid = ANY (ARRAY (
		SELECT ctid FROM ` + table + ` WHERE ` + where + ` ORDER BY ` + order + ` LIMIT $1 FOR UPDATE SKIP LOCKED))`
}

// Purge runs a statement from [PurgeSQL] in batches of batch rows until a batch deletes
// fewer, or maxBatches statements have run (0: no limit), waiting pause between two
// statements. args are $2 onwards. A context cancelled during a pause ends the purge
// with the context's error and what was deleted so far.
func Purge(ctx context.Context, q Execer, sql string, batch, maxBatches int, pause time.Duration, args ...any) (deleted int64, batches int, err error) {
	args = append([]any{batch}, args...)
	for maxBatches == 0 || batches < maxBatches {
		if batches > 0 && pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return deleted, batches, ctx.Err()
			case <-t.C:
			}
		}
		tag, err := q.Exec(ctx, sql, args...)
		if err != nil {
			return deleted, batches, err
		}
		batches++
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	return deleted, batches, nil
}

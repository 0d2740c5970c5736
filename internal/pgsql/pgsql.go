// Package pgsql holds the SQL mechanics oncekit's PostgreSQL packages share: a
// transaction begun by a one-round-trip script, literal quoting for such scripts, and
// batched deletes that many nodes may run at once.
package pgsql

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit/internal/config"
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
	DivisionByZero            = "22012"
	CharacterNotInRepertoire  = "22021"
	InvalidTextRepresentation = "22P02"
	UntranslatableCharacter   = "22P05"
	UniqueViolation           = "23505"
	CheckViolation            = "23514"
	InFailedSQLTransaction    = "25P02"
	SerializationFailure      = "40001"
	LockNotAvailable          = "55P03"
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
// Through a Citus coordinator the error comes from a worker without ConstraintName,
// and its message names the shard's constraint, the name followed by "_" and the
// shard's ID: that name is recognised too.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != UniqueViolation {
		return false
	}
	if pgErr.ConstraintName != "" {
		return pgErr.ConstraintName == constraint
	}
	// duplicate key value violates unique constraint "records_pkey_102028"
	_, name, ok := strings.Cut(pgErr.Message, `"`)
	name, _, closed := strings.Cut(name, `"`)
	if !ok || !closed {
		return false
	}
	shard, ok := strings.CutPrefix(name, constraint+"_")
	if !ok || shard == "" {
		return false
	}
	for _, c := range shard {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Purge is a batched delete, as two statements that each delete at most $1 rows of a
// table (schema-qualified and quoted) matching a condition, in order. Local picks its
// rows by ctid FOR UPDATE SKIP LOCKED, so that concurrent purgers share the work. Citus
// refuses both on the tables it holds (a ctid names a row of one node, and SKIP LOCKED
// works across shards only with the tenant given), where ByKey picks the rows by
// primary key instead, in an order the key completes, so that every node holding a
// reference table picks the same rows: concurrent purgers may then pick the same rows,
// and one waits for the other's delete. Citus picks the rows first and deletes them
// after, so ByKey's delete checks the condition again: a row changed in between, such
// as an expired record taken over by a new intent, is kept.
type Purge struct {
	Table, Local, ByKey string
}

// PurgeSQL returns the statements of a purge of table, whose primary key is the columns
// key. where and order refer to the purge's own arguments as $2 onwards.
func PurgeSQL(table string, key []string, where, order string) Purge {
	k := strings.Join(key, ", ")
	return Purge{
		Table: table,
		Local: `DELETE FROM ` + table + ` WHERE ctid = ANY (ARRAY (
		SELECT ctid FROM ` + table + ` WHERE ` + where + ` ORDER BY ` + order + ` LIMIT $1 FOR UPDATE SKIP LOCKED))`,
		ByKey: `DELETE FROM ` + table + ` WHERE (` + k + `) IN (
		SELECT ` + k + ` FROM ` + table + ` WHERE ` + where + ` ORDER BY ` + order + `, ` + k + ` LIMIT $1) AND ` + where,
	}
}

// Querier runs statements and queries: a pool, a connection or a transaction.
type Querier interface {
	Execer
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CitusTable reports whether Citus holds table (schema-qualified and quoted): a
// distributed, reference or local table. On a database without Citus it costs one catalog
// lookup.
func CitusTable(ctx context.Context, q Querier, table string) (bool, error) {
	var citus bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil || !citus {
		return false, err
	}
	var held bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`, table).Scan(&held)
	return held, err
}

// PurgeGrace is how long a purge's batch in flight may go on once the purge's context
// has ended.
const PurgeGrace = 10 * time.Second

// execGrace runs sql with a context that ends PurgeGrace after ctx does.
func execGrace(ctx context.Context, q Querier, sql string, args ...any) (pgconn.CommandTag, error) {
	ectx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(PurgeGrace, cancel)
		context.AfterFunc(ectx, func() { t.Stop() })
	})
	defer stop()
	return q.Exec(ectx, sql, args...)
}

// ErrPurgeNegative is Run's answer to a negative batch size or batch count.
var ErrPurgeNegative = errors.New("PurgeOpts.BatchSize and MaxBatches must not be negative: leave them 0 for the defaults")

// Run runs the purge in batches of batch rows (0: config.PurgeBatchDefault) until a
// batch deletes fewer, or maxBatches statements have run (0: no limit), waiting pause
// between two statements (0: config.PurgePauseDefault; negative: no pause): Local on a
// single PostgreSQL, ByKey when Citus holds the table. args are $2 onwards. A context
// that ends during a pause ends the purge with the context's error and what was deleted
// so far; one that ends while a batch runs lets the batch finish for up to PurgeGrace,
// so that its rows, deleted and committed, are counted rather than lost with its
// answer. A negative batch or maxBatches ends it with ErrPurgeNegative before anything
// is sent.
func (p Purge) Run(ctx context.Context, q Querier, batch, maxBatches int, pause time.Duration, args ...any) (deleted int64, batches int, err error) {
	if batch < 0 || maxBatches < 0 {
		return 0, 0, ErrPurgeNegative
	}
	batch = config.Or(batch, config.PurgeBatchDefault)
	pause = config.Or(pause, config.PurgePauseDefault)
	sql := p.Local
	if held, err := CitusTable(ctx, q, p.Table); err != nil {
		return 0, 0, err
	} else if held {
		sql = p.ByKey
	}
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
		tag, err := execGrace(ctx, q, sql, args...)
		if err != nil {
			return deleted, batches, err
		}
		batches++
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
		if ctx.Err() != nil {
			return deleted, batches, ctx.Err()
		}
	}
	return deleted, batches, nil
}

// CommitUnknown reports whether err, the answer to a round trip that carried a commit
// (COMMIT, or a statement outside a transaction, which commits by itself), leaves the
// commit's outcome unknown. A commit has one of three outcomes for the client: it
// committed (no error); it rolled back, which PostgreSQL says with an ERROR reply (or a
// ROLLBACK tag, pgx.ErrTxCommitRollback); or it is unknown: anything else, such as a
// FATAL (a backend terminated or a server shut down, which PostgreSQL may send after
// the commit became durable), a broken or cut connection, a context that ended while
// the answer was awaited.
//
// pgconn.SafeToRetry is not taken to mean "not sent" here: when a FATAL arrives while
// pgx reads a result, pgx closes the connection and may report the next read as "conn
// closed", an error it calls safe to retry, for a commit that was sent and took effect.
func CommitUnknown(err error) bool {
	if err == nil || errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, pgx.ErrNoRows) {
		// No error, a rollback, or an answer that arrived whole and had no row.
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := pgErr.SeverityUnlocalized
		if sev == "" {
			sev = pgErr.Severity
		}
		return sev == "FATAL" || sev == "PANIC"
	}
	return true
}

// CleanupTimeout bounds how long a rollback (or any statement that undoes a call's
// work) waits for its answer. Cleanup runs without the call's cancellation, so that a
// cancelled call still cleans up; without a bound, a rollback whose answer is lost in a
// network partition would wait as long as the connection lives. Past the bound, pgx
// closes the connection, which ends its transaction with a rollback on the server.
const CleanupTimeout = 2 * time.Second

// Cleanup returns the context a rollback runs on: ctx's values without its
// cancellation, bounded by [CleanupTimeout] from now.
func Cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// LockKey is the key of an advisory lock named by parts: 64 bits of a SHA-256 over
// them, each ended by a unit separator, so that different names never contend in
// practice.
func LockKey(parts ...string) int64 {
	h := sha256.New()
	for _, s := range parts {
		h.Write([]byte(s))
		h.Write([]byte{0x1f})
	}
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

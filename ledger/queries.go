package ledger

import (
	"context"
	"embed"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
)

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// queries holds the ledger's SQL with the schema filled in. Statements about one key
// take it as $1 tenant, $2 operation, $3 key, and the clock as $4, a nullable
// timestamptz: NULL means the database's now().
type queries struct {
	lookup string
	// get is lookup with the record's origin, for operators.
	get string
	// Do claims with claimLocal, which fails with division_by_zero when the
	// key is taken, or claimCheck, which answers, each behind claimLock, which tries
	// the key's lock before the claim's snapshot is taken; in a caller's transaction
	// claimProbe follows the claim, for records its snapshot cannot see.
	claimLock  string
	claimLocal string
	claimCheck string
	claimProbe string
	// A refused claim waits for the key's lock with waitLock, on the node the claim
	// takes it on.
	waitLock string
	// ClaimTx bounds its claim's wait with lock_timeout, on the node the claim runs on.
	keepLockTimeout, restoreLockTimeout string
	// Do inserts its record, with the result, just before it commits,
	// replacing an expired record of the key.
	insertCompleted string
	insertFailed    string
	// DoStatement's guarded statement in its two forms (see sql/statement.sql), with
	// the caller's statement to fill in, and the look-up sent ahead of it, which also
	// tries the key's lock.
	statementFirst, statementReplace string
	statementLookup                  string
	// Claim claims, then finishes the record under the owner token.
	claim     string
	complete  string
	fail      string
	release   string
	uncertain string
	extend    string
	purge     pgsql.Purge
	// Operators read and change records whatever their owner; their changes keep audit
	// rows. pending counts pending records for the gauge.
	list, stats                     string
	changeLock, changeDelete, audit string
	auditList                       string
	pending                         string
}

// statements are the ledger's SQL, one whole statement per file, each listing its
// parameters; {{records}} stands for the schema-qualified records table, {{audit}} for
// the operators' audit table.
//
//go:embed sql/*.sql
var statements embed.FS

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "idempotency_records"}.Sanitize()
	audit := pgx.Identifier{schema, "idempotency_audit"}.Sanitize()
	load := func(name string) string {
		b, err := statements.ReadFile("sql/" + name + ".sql")
		if err != nil {
			panic("oncekit/ledger: missing statement " + name) // embedded: cannot happen
		}
		return strings.NewReplacer("{{records}}", t, "{{audit}}", audit).Replace(string(b))
	}
	return queries{
		lookup:             load("lookup"),
		get:                load("get"),
		claimLock:          load("claim_lock"),
		claimLocal:         load("claim_local"),
		claimCheck:         load("claim_check"),
		claimProbe:         load("claim_probe"),
		waitLock:           load("wait_lock"),
		keepLockTimeout:    load("keep_lock_timeout"),
		restoreLockTimeout: load("restore_lock_timeout"),
		insertCompleted:    load("insert_completed"),
		insertFailed:       load("insert_failed"),
		statementFirst:     statementSpans.ReplaceAllString(load("statement"), ""),
		statementReplace:   statementMarks.Replace(load("statement")),
		statementLookup:    strings.ReplaceAll(load("statement_lookup"), "{{lookup}}", uncommented(load("lookup"))),
		claim:              load("claim"),
		complete:           load("complete"),
		fail:               load("fail"),
		release:            load("release"),
		uncertain:          load("uncertain"),
		extend:             load("extend"),
		purge:              pgsql.Purge{Table: t, Local: load("purge"), ByKey: load("purge_by_key")},
		list:               load("list"),
		stats:              load("stats"),
		changeLock:         load("change_lock"),
		changeDelete:       load("change_delete"),
		audit:              load("audit"),
		auditList:          load("audit_list"),
		pending:            load("pending"),
	}
}

// uncommented is a statement without its lines of comment, to be put inside another.
func uncommented(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return strings.TrimSpace(b.String())
}

func (l *Ledger) lookup(ctx context.Context, q querier, scope keys.Scope, key keys.Key) (*Record, error) {
	r := &Record{Scope: scope, Key: key}
	var sc recordScan
	err := q.QueryRow(ctx, l.q.lookup, scope.Tenant, scope.Operation, string(key), l.now()).Scan(sc.dest(r)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sc.finish(r)
	return r, nil
}

// recordScan receives the columns every record query returns after the key: the record
// (fingerprint to expires_at) and whether it and its lease have expired.
type recordScan struct {
	fp, state            string
	body                 []byte
	errCode, errMsg, ref *string
	token                *uuid.UUID
	leaseUntil           *time.Time
	statusCode, attempts int32
}

func (sc *recordScan) dest(r *Record) []any {
	return []any{&sc.fp, &sc.state, &sc.statusCode, &sc.body, &sc.errCode, &sc.errMsg, &sc.ref, &sc.token, &sc.leaseUntil,
		&r.Uncertain, &sc.attempts, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.Expired, &r.LeaseExpired}
}

func (sc *recordScan) finish(r *Record) {
	r.Fingerprint, r.State = keys.Fingerprint(sc.fp), State(sc.state)
	r.Response = Response{Code: int(sc.statusCode), Body: sc.body, ResourceRef: deref(sc.ref)}
	r.ErrorCode, r.ErrorMessage = deref(sc.errCode), deref(sc.errMsg)
	if sc.token != nil {
		r.OwnerToken = *sc.token
	}
	if sc.leaseUntil != nil {
		r.LeaseUntil = *sc.leaseUntil
	}
	r.Attempts = int(sc.attempts)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// The parts of sql/statement.sql that only its replacing form has, and their marks.
var (
	statementSpans = regexp.MustCompile(`(?s)\{\{replace\}\}.*?\{\{/replace\}\}`)
	statementMarks = strings.NewReplacer("{{replace}}", "", "{{/replace}}", "")
)

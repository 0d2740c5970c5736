package ledger

import (
	"context"
	"embed"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// The local mode claims with claimLocal, which fails with division_by_zero when the
	// key is taken, and removes an expired record with deleteExpired.
	claimLocal    string
	claimCheck    string
	deleteExpired string
	// The local mode inserts its record, with the result, just before it commits.
	insertCompleted string
	insertFailed    string
	// The external mode claims, then finishes the record under the owner token.
	claim     string
	complete  string
	fail      string
	release   string
	uncertain string
	extend    string
	purge     string
}

// statements are the ledger's SQL, one whole statement per file, each listing its
// parameters; {{records}} stands for the schema-qualified records table.
//
//go:embed sql/*.sql
var statements embed.FS

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "idempotency_records"}.Sanitize()
	load := func(name string) string {
		b, err := statements.ReadFile("sql/" + name + ".sql")
		if err != nil {
			panic("oncekit/ledger: missing statement " + name) // embedded: cannot happen
		}
		return strings.ReplaceAll(string(b), "{{records}}", t)
	}
	return queries{
		lookup:          load("lookup"),
		claimLocal:      load("claim_local"),
		claimCheck:      load("claim_check"),
		deleteExpired:   load("delete_expired"),
		insertCompleted: load("insert_completed"),
		insertFailed:    load("insert_failed"),
		claim:           load("claim"),
		complete:        load("complete"),
		fail:            load("fail"),
		release:         load("release"),
		uncertain:       load("uncertain"),
		extend:          load("extend"),
		purge:           load("purge"),
	}
}

func (l *Ledger) lookup(ctx context.Context, q querier, scope keys.Scope, key keys.Key) (*Record, error) {
	r := &Record{Scope: scope, Key: key}
	var (
		fp, state            string
		body                 []byte
		errCode, errMsg, ref *string
		token                *uuid.UUID
		leaseUntil           *time.Time
		statusCode, attempts int32
	)
	err := q.QueryRow(ctx, l.q.lookup, scope.Tenant, scope.Operation, string(key), l.now()).Scan(
		&fp, &state, &statusCode, &body, &errCode, &errMsg, &ref, &token, &leaseUntil, &r.Uncertain,
		&attempts, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.Expired, &r.LeaseExpired)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r.Fingerprint, r.State = keys.Fingerprint(fp), State(state)
	r.Response = Response{Code: int(statusCode), Body: body, ResourceRef: deref(ref)}
	r.ErrorCode, r.ErrorMessage = deref(errCode), deref(errMsg)
	if token != nil {
		r.OwnerToken = *token
	}
	if leaseUntil != nil {
		r.LeaseUntil = *leaseUntil
	}
	r.Attempts = int(attempts)
	return r, nil
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

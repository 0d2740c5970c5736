package ledger

import (
	"context"
	"errors"
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

const recordColumns = `fingerprint, state, status_code, body, error_code, error_message, resource_ref,
	owner_token, lease_until, uncertain, attempts, created_at, updated_at, expires_at`

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "idempotency_records"}.Sanitize()
	now := "coalesce($4::timestamptz, now())"
	pk := "tenant = $1 AND operation = $2 AND key = $3"
	owned := pk + " AND state = 'pending' AND owner_token = $5"
	insertFinal := func(state, cols, vals string) string {
		return `INSERT INTO ` + t + ` (tenant, operation, key, fingerprint, state, ` + cols + `, attempts, created_at, updated_at, expires_at)
			VALUES ($1, $2, $3, $5, '` + state + `', ` + vals + `, 1, ` + now + `, ` + now + `, ` + now + ` + $6::interval)
			RETURNING created_at`
	}
	return queries{
		lookup: `SELECT ` + recordColumns + `,
			expires_at <= ` + now + `,
			coalesce(lease_until <= ` + now + `, true)
			FROM ` + t + ` WHERE ` + pk,
		// $1 advisory lock, $2-$4 the key, $5 now. The lock is tried, not waited for, and
		// the record looked for only when the lock is held; either refusal divides by
		// zero, so that PostgreSQL skips the statements pipelined behind the claim.
		claimLocal: `SELECT 1 / CASE
				WHEN NOT pg_try_advisory_xact_lock($1) THEN 0
				WHEN EXISTS (SELECT 1 FROM ` + t + ` WHERE tenant = $2 AND operation = $3 AND key = $4
					AND expires_at > coalesce($5::timestamptz, now())) THEN 0
				ELSE 1 END`,
		// The same claim answering true or false, for a claim sent before fn runs: a
		// refusal then leaves the transaction healthy, so its rollback can travel with
		// the lookup that follows.
		claimCheck: `SELECT CASE
				WHEN NOT pg_try_advisory_xact_lock($1) THEN false
				WHEN EXISTS (SELECT 1 FROM ` + t + ` WHERE tenant = $2 AND operation = $3 AND key = $4
					AND expires_at > coalesce($5::timestamptz, now())) THEN false
				ELSE true END`,
		deleteExpired: `DELETE FROM ` + t + ` WHERE ` + pk + ` AND expires_at <= ` + now,
		// $5 fingerprint, $6 retention, then the result.
		insertCompleted: insertFinal("completed", "status_code, body, resource_ref", "$7, $8, $9"),
		insertFailed:    insertFinal("failed", "error_code, error_message", "$7, $8"),
		// $5 fingerprint, $6 token, $7 lease, $8 retention. Takes over an expired record
		// (as a new intent) or a pending one whose lease ran out (same intent, next attempt).
		claim: `INSERT INTO ` + t + ` AS r (tenant, operation, key, fingerprint, state, owner_token, lease_until,
				attempts, created_at, updated_at, expires_at)
			VALUES ($1, $2, $3, $5, 'pending', $6, ` + now + ` + $7::interval, 1, ` + now + `, ` + now + `, ` + now + ` + $8::interval)
			ON CONFLICT (tenant, operation, key) DO UPDATE SET
				owner_token = excluded.owner_token,
				lease_until = excluded.lease_until,
				updated_at = excluded.updated_at,
				state = 'pending', status_code = 0, body = NULL, error_code = NULL, error_message = NULL, resource_ref = NULL,
				fingerprint = CASE WHEN r.expires_at <= ` + now + ` THEN excluded.fingerprint ELSE r.fingerprint END,
				uncertain = CASE WHEN r.expires_at <= ` + now + ` THEN false ELSE r.uncertain END,
				attempts = CASE WHEN r.expires_at <= ` + now + ` THEN 1 ELSE r.attempts + 1 END,
				created_at = CASE WHEN r.expires_at <= ` + now + ` THEN excluded.created_at ELSE r.created_at END,
				expires_at = CASE WHEN r.expires_at <= ` + now + ` THEN excluded.expires_at ELSE greatest(r.expires_at, excluded.expires_at) END
			WHERE r.expires_at <= ` + now + `
				OR (r.state = 'pending' AND r.lease_until <= ` + now + ` AND r.fingerprint = excluded.fingerprint)
			RETURNING r.attempts, r.uncertain, r.lease_until, r.created_at`,
		// $5 token, $6 status, $7 body, $8 resource ref.
		complete: `UPDATE ` + t + ` SET state = 'completed', status_code = $6, body = $7, resource_ref = $8,
				owner_token = NULL, lease_until = NULL, updated_at = ` + now + `
			WHERE ` + owned + ` RETURNING attempts, created_at`,
		// $5 token, $6 error code, $7 error message.
		fail: `UPDATE ` + t + ` SET state = 'failed', error_code = $6, error_message = $7,
				owner_token = NULL, lease_until = NULL, updated_at = ` + now + `
			WHERE ` + owned + ` RETURNING attempts, created_at`,
		// $4 token.
		release: `DELETE FROM ` + t + ` WHERE ` + pk + ` AND state = 'pending' AND owner_token = $4`,
		// $5 token. The lease ends now, so the next attempt takes over at once and
		// re-drives the call.
		uncertain: `UPDATE ` + t + ` SET uncertain = true, owner_token = NULL, lease_until = ` + now + `, updated_at = ` + now + `
			WHERE ` + owned,
		// $5 token, $6 lease.
		extend: `UPDATE ` + t + ` SET lease_until = ` + now + ` + $6::interval, updated_at = ` + now + `
			WHERE ` + owned + ` RETURNING lease_until`,
		// $1 batch size, $2 now. A pending record with a live lease is kept.
		purge: pgsql.PurgeSQL(t, `expires_at <= coalesce($2::timestamptz, now())
				AND (state <> 'pending' OR lease_until IS NULL OR lease_until <= coalesce($2::timestamptz, now()))`, "expires_at"),
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

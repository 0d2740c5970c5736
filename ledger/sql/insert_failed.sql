-- The local mode's record of a definitive failure, inserted just before the transaction
-- commits.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 fingerprint,
-- $6 retention, $7 error code, $8 error message, $9 the time of the record (the caller's
-- clock), as in insert_completed.
INSERT INTO {{records}} (tenant, operation, key, fingerprint, state, error_code, error_message, attempts, created_at, updated_at, expires_at)
    VALUES ($1, $2, $3, $5, 'failed', $7, $8, 1, $9, $9, greatest($9, coalesce($4::timestamptz, now())) + $6::interval)

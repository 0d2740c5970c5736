-- The local mode's record with its result, inserted just before the transaction commits.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 fingerprint,
-- $6 retention, $7 status code, $8 body, $9 resource reference, $10 the time of the
-- record (the caller's clock). The record expires a retention after that time, or after
-- now if the caller's clock is behind, so that it never expires early. Nothing is
-- returned, which spares the server a result to build and send.
INSERT INTO {{records}} (tenant, operation, key, fingerprint, state, status_code, body, resource_ref, attempts, created_at, updated_at, expires_at)
    VALUES ($1, $2, $3, $5, 'completed', $7, $8, $9, 1, $10, $10, greatest($10, coalesce($4::timestamptz, now())) + $6::interval)

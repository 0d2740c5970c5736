-- The local mode's record with its result, inserted just before the transaction commits.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 fingerprint,
-- $6 retention, $7 status code, $8 body, $9 resource reference, $10 the time of the
-- record (the caller's clock, its created_at), $11 workflow ID, $12 run ID, $13 workflow
-- type, $14 activity type (the record's origin, each NULL for none). The record expires a retention after that
-- time, or after now if the caller's clock is behind, so that it never expires early; its
-- updated_at is now, which the conflict branch reads instead of calling now() (Citus refuses
-- any function that is not immutable there). It replaces an
-- expired record of the key (which counts as absent) and the caller's own placeholder
-- (attempts 0, see claim_probe); meeting a live record, it sets a state the table's
-- check refuses, so the statement fails with check_violation (23514) and the
-- transaction, with everything the mutation wrote, rolls back. Nothing is returned,
-- which spares the server a result to build and send.
INSERT INTO {{records}} AS r (tenant, operation, key, fingerprint, state, status_code, body, resource_ref, attempts, created_at, updated_at, expires_at,
        workflow_id, run_id, workflow_type, activity_type)
    VALUES ($1, $2, $3, $5, 'completed', $7, $8, $9, 1, $10, coalesce($4::timestamptz, now()), greatest($10, coalesce($4::timestamptz, now())) + $6::interval,
        $11, $12, $13, $14)
    ON CONFLICT (tenant, operation, key) DO UPDATE SET
        state = CASE WHEN r.expires_at <= excluded.updated_at OR r.attempts = 0 THEN excluded.state ELSE 'taken' END,
        fingerprint = excluded.fingerprint, status_code = excluded.status_code, body = excluded.body,
        error_code = NULL, error_message = NULL, resource_ref = excluded.resource_ref, owner_token = NULL,
        lease_until = NULL, uncertain = false, attempts = 1, created_at = excluded.created_at,
        updated_at = excluded.updated_at, expires_at = excluded.expires_at, workflow_id = excluded.workflow_id,
        run_id = excluded.run_id, workflow_type = excluded.workflow_type, activity_type = excluded.activity_type

-- The local mode's record of a definitive failure, inserted just before the transaction
-- commits, replacing an expired record or the caller's placeholder as insert_completed
-- does.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 fingerprint,
-- $6 retention, $7 error code, $8 error message, $9 the time of the record (the caller's
-- clock), as in insert_completed; $10 the failure's status code (0: none) and $11 its body;
-- $12 to $15 the record's origin, as $11 to $14 of insert_completed.
INSERT INTO {{records}} AS r (tenant, operation, key, fingerprint, state, error_code, error_message, status_code, body, attempts, created_at, updated_at, expires_at,
        workflow_id, run_id, workflow_type, activity_type)
    VALUES ($1, $2, $3, $5, 'failed', $7, $8, $10, $11, 1, $9, coalesce($4::timestamptz, now()), greatest($9, coalesce($4::timestamptz, now())) + $6::interval,
        $12, $13, $14, $15)
    ON CONFLICT (tenant, operation, key) DO UPDATE SET
        state = CASE WHEN r.expires_at <= excluded.updated_at OR r.attempts = 0 THEN excluded.state ELSE 'taken' END,
        fingerprint = excluded.fingerprint, status_code = excluded.status_code, body = excluded.body, error_code = excluded.error_code,
        error_message = excluded.error_message, resource_ref = NULL, owner_token = NULL, lease_until = NULL,
        uncertain = false, attempts = 1, created_at = excluded.created_at, updated_at = excluded.updated_at,
        expires_at = excluded.expires_at, workflow_id = excluded.workflow_id, run_id = excluded.run_id,
        workflow_type = excluded.workflow_type, activity_type = excluded.activity_type

-- The external mode's claim, committed before the call. It takes over an expired record (as
-- a new intent) or a pending one whose lease ran out (the same intent, next attempt). A
-- pending record expires no earlier than its lease ends, so that neither a purge nor another
-- attempt takes a key whose holder is still within its lease.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 fingerprint,
-- $6 owner token, $7 lease, $8 retention, $9 workflow ID, $10 run ID, $11 workflow type,
-- $12 activity type (the record's origin, each NULL for none). A new intent records its
-- origin; a later attempt of the same intent keeps the first one's, filling in what it
-- lacked.
-- The conflict branch reads the time from the row it would have inserted (excluded.updated_at)
-- rather than calling now(): Citus refuses any function that is not immutable there, and
-- the time is the same.
INSERT INTO {{records}} AS r (tenant, operation, key, fingerprint, state, owner_token, lease_until,
        attempts, created_at, updated_at, expires_at, workflow_id, run_id, workflow_type, activity_type)
    VALUES ($1, $2, $3, $5, 'pending', $6, coalesce($4::timestamptz, now()) + $7::interval, 1, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()) + greatest($7::interval, $8::interval),
        $9, $10, $11, $12)
    ON CONFLICT (tenant, operation, key) DO UPDATE SET
        owner_token = excluded.owner_token,
        lease_until = excluded.lease_until,
        updated_at = excluded.updated_at,
        state = 'pending', status_code = 0, body = NULL, error_code = NULL, error_message = NULL, resource_ref = NULL,
        fingerprint = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.fingerprint ELSE r.fingerprint END,
        uncertain = CASE WHEN r.expires_at <= excluded.updated_at THEN false ELSE r.uncertain END,
        attempts = CASE WHEN r.expires_at <= excluded.updated_at THEN 1 ELSE r.attempts + 1 END,
        created_at = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.created_at ELSE r.created_at END,
        workflow_id = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.workflow_id ELSE coalesce(r.workflow_id, excluded.workflow_id) END,
        run_id = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.run_id ELSE coalesce(r.run_id, excluded.run_id) END,
        workflow_type = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.workflow_type ELSE coalesce(r.workflow_type, excluded.workflow_type) END,
        activity_type = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.activity_type ELSE coalesce(r.activity_type, excluded.activity_type) END,
        expires_at = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.expires_at ELSE greatest(r.expires_at, excluded.expires_at) END
    WHERE r.expires_at <= excluded.updated_at
        OR (r.state = 'pending' AND r.lease_until <= excluded.updated_at AND r.fingerprint = excluded.fingerprint)
    RETURNING r.attempts, r.uncertain, r.lease_until, r.created_at

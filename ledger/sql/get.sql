-- The record of a key for operators (Ledger.Get): lookup's columns, then the record's
-- origin. $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock).
SELECT fingerprint, state, status_code, body, error_code, error_message, resource_ref,
    owner_token, lease_until, uncertain, attempts, created_at, updated_at, expires_at,
        expires_at <= coalesce($4::timestamptz, now()),
        coalesce(lease_until <= coalesce($4::timestamptz, now()), true),
        workflow_id, run_id, workflow_type, activity_type
        FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3

-- Records newest first, for operators, a page at a time.
-- $1 state ('' for any), $2 operation ('' for any), $3 tenant ('' for any), $4 minimum age
-- in seconds, $5 only pending records whose lease ran out, $6 limit, $7 now (NULL: the
-- database clock), $8 key prefix ('' for any), $9 LIKE patterns of which the key matches
-- one (empty for any), $10 created at or after (NULL for any), $11 created before (NULL
-- for any), $12-$15 the created_at, tenant, operation and key of the record the page
-- starts after (NULL $12 for the first page), $16-$18 the workflow ID, run ID and activity
-- type of the record's origin ('' for any; a record passes when its origin has every one
-- given, or, having no origin, when its key matches one of $9).
SELECT tenant, operation, key, fingerprint, state, status_code, body, error_code, error_message, resource_ref,
    owner_token, lease_until, uncertain, attempts, created_at, updated_at, expires_at,
    expires_at <= coalesce($7::timestamptz, now()),
    coalesce(lease_until <= coalesce($7::timestamptz, now()), true),
    workflow_id, run_id, workflow_type, activity_type
FROM {{records}}
WHERE ($1 = '' OR state = $1) AND ($2 = '' OR operation = $2) AND ($3 = '' OR tenant = $3)
    AND created_at <= coalesce($7::timestamptz, now()) - make_interval(secs => $4)
    AND (NOT $5 OR (state = 'pending' AND lease_until <= coalesce($7::timestamptz, now())))
    AND ($8 = '' OR starts_with(key, $8))
    AND ((cardinality($9::text[]) = 0 AND $16 = '' AND $17 = '' AND $18 = '')
        OR (($16 <> '' OR $17 <> '' OR $18 <> '')
            AND ($16 = '' OR workflow_id = $16) AND ($17 = '' OR run_id = $17) AND ($18 = '' OR activity_type = $18))
        OR (key LIKE ANY ($9::text[])
            AND (($16 = '' AND $17 = '' AND $18 = '') OR (workflow_id IS NULL AND run_id IS NULL AND activity_type IS NULL))))
    AND ($10::timestamptz IS NULL OR created_at >= $10::timestamptz)
    AND ($11::timestamptz IS NULL OR created_at < $11::timestamptz)
    AND ($12::timestamptz IS NULL OR (created_at, tenant, operation, key) < ($12::timestamptz, $13::text, $14::text, $15::text))
ORDER BY created_at DESC, tenant DESC, operation DESC, key DESC
LIMIT $6

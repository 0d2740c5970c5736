-- Records newest first, for operators.
-- $1 state ('' for any), $2 operation ('' for any), $3 tenant ('' for any), $4 minimum age
-- in seconds, $5 only pending records whose lease ran out, $6 limit, $7 now (NULL: the
-- database clock).
SELECT tenant, operation, key, fingerprint, state, status_code, body, error_code, error_message, resource_ref,
    owner_token, lease_until, uncertain, attempts, created_at, updated_at, expires_at,
    expires_at <= coalesce($7::timestamptz, now()),
    coalesce(lease_until <= coalesce($7::timestamptz, now()), true)
FROM {{records}}
WHERE ($1 = '' OR state = $1) AND ($2 = '' OR operation = $2) AND ($3 = '' OR tenant = $3)
    AND created_at <= coalesce($7::timestamptz, now()) - make_interval(secs => $4)
    AND (NOT $5 OR (state = 'pending' AND lease_until <= coalesce($7::timestamptz, now())))
ORDER BY created_at DESC
LIMIT $6

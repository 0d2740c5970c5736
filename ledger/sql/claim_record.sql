-- The local mode's claim in the ledger's own transaction, sent with the mutation's first
-- statement, that also reads the key's record: the advisory lock is tried, not waited
-- for, and the claim refuses when it is taken or the record is live. It returns two
-- rows. The first carries the record (found false when there is none), and PostgreSQL
-- sends it before it makes the second, which divides by zero when the claim refused, so
-- that PostgreSQL skips the statements pipelined behind the claim and the caller still
-- holds the record that answers the call: a replay needs no read of its own.
-- $1 advisory lock, $2 tenant, $3 operation, $4 key, $5 now (NULL: the database clock).
WITH c AS MATERIALIZED (
    SELECT k.locked, r.key IS NOT NULL AS found, r.fingerprint, r.state, r.status_code, r.body, r.error_code,
        r.error_message, r.resource_ref, r.owner_token, r.lease_until, r.uncertain, r.attempts, r.created_at,
        r.updated_at, r.expires_at, r.expires_at <= coalesce($5::timestamptz, now()) AS expired,
        coalesce(r.lease_until <= coalesce($5::timestamptz, now()), true) AS lease_expired
    FROM (SELECT pg_try_advisory_xact_lock($1) AS locked OFFSET 0) k
    LEFT JOIN {{records}} r ON r.tenant = $2 AND r.operation = $3 AND r.key = $4
)
SELECT found, coalesce(fingerprint, ''), coalesce(state, ''), coalesce(status_code, 0), body, error_code, error_message,
    resource_ref, owner_token, lease_until, coalesce(uncertain, false), coalesce(attempts, 0),
    coalesce(created_at, 'epoch'), coalesce(updated_at, 'epoch'), coalesce(expires_at, 'epoch'), coalesce(expired, true), lease_expired,
    1 / CASE WHEN v.n = 1 OR (locked AND NOT coalesce(NOT expired, false)) THEN 1 ELSE 0 END
FROM (VALUES (1), (2)) v (n), c

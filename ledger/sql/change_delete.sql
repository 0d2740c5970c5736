-- Deletes a record for an operator and keeps the audit row in the same statement: the
-- record as it was, its body replaced by the body's size and SHA-256.
-- $1 tenant, $2 operation, $3 key, $4 action, $5 actor, $6 reason, $7 forced.
WITH gone AS (
    DELETE FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3 RETURNING *
)
INSERT INTO {{audit}} (tenant, operation, key, action, actor, reason, forced, before)
SELECT tenant, operation, key, $4, $5, $6, $7,
    (to_jsonb(gone) - 'body') || jsonb_build_object('body_bytes', coalesce(octet_length(body), 0),
        'body_sha256', coalesce(encode(sha256(body), 'hex'), ''))
FROM gone
RETURNING id, at, db_user, before

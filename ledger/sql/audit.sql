-- The audit rows of a key, oldest first.
-- $1 tenant, $2 operation, $3 key.
SELECT id, at, action, actor, db_user, reason, forced, before
FROM {{audit}} WHERE tenant = $1 AND operation = $2 AND key = $3
ORDER BY id

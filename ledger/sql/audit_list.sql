-- Audit rows, newest first, filtered; an empty filter matches every row.
-- $1 tenant, $2 operation, $3 key, $4 actor, $5 action, $6 at or after (or NULL),
-- $7 before (or NULL), $8 limit.
SELECT id, at, tenant, operation, key, action, actor, db_user, reason, forced, before
FROM {{audit}}
WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR operation = $2) AND ($3 = '' OR key = $3)
    AND ($4 = '' OR actor = $4) AND ($5 = '' OR action = $5)
    AND ($6::timestamptz IS NULL OR at >= $6) AND ($7::timestamptz IS NULL OR at < $7)
ORDER BY at DESC, id DESC
LIMIT $8

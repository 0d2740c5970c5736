-- Removes an expired record, making way for a new intent under its key.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock).
DELETE FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3 AND expires_at <= coalesce($4::timestamptz, now())

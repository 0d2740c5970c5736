-- purge as Citus accepts it on a distributed records table, whose shards refuse ctid
-- and FOR UPDATE SKIP LOCKED across tenants: the batch is picked by primary key, and a
-- concurrent purger that picked the same records waits for this delete. The delete
-- checks each picked record again: Citus runs the pick first and the delete after it, and
-- a record taken over by a new intent in between is live again. The times are subqueries
-- because Citus refuses COALESCE over now() in a DELETE's condition.
-- $1 batch size, $2 now (NULL: the database clock).
DELETE FROM {{records}} WHERE (tenant, operation, key) IN (
    SELECT tenant, operation, key FROM {{records}} WHERE expires_at <= coalesce($2::timestamptz, now())
        AND (state <> 'pending' OR lease_until IS NULL OR lease_until <= coalesce($2::timestamptz, now())) ORDER BY expires_at, tenant, operation, key LIMIT $1)
    AND expires_at <= (SELECT coalesce($2::timestamptz, now()))
    AND (state <> 'pending' OR lease_until IS NULL OR lease_until <= (SELECT coalesce($2::timestamptz, now())))

-- Deletes at most $1 expired records, oldest first, skipping rows another purger holds; a
-- pending record with a live lease is kept.
-- $1 batch size, $2 now (NULL: the database clock).
DELETE FROM {{records}} WHERE ctid = ANY (ARRAY (
    SELECT ctid FROM {{records}} WHERE expires_at <= coalesce($2::timestamptz, now())
        AND (state <> 'pending' OR lease_until IS NULL OR lease_until <= coalesce($2::timestamptz, now())) ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))

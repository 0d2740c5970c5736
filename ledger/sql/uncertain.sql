-- Records that the call may have happened and ends the lease now, so the next attempt
-- takes over at once and re-drives the call.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 owner token.
-- The time is a subquery, evaluated once: Citus refuses COALESCE over a function that is
-- not immutable in an UPDATE, and accepts it there.
UPDATE {{records}} SET uncertain = true, owner_token = NULL, lease_until = (SELECT coalesce($4::timestamptz, now())), updated_at = (SELECT coalesce($4::timestamptz, now()))
    WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND owner_token = $5

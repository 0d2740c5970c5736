-- Stores the external call's result under the owner token and ends the lease.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 owner token,
-- $6 status code, $7 body, $8 resource reference.
-- The time is a subquery, evaluated once: Citus refuses COALESCE over a function that is
-- not immutable in an UPDATE, and accepts it there.
UPDATE {{records}} SET state = 'completed', status_code = $6, body = $7, resource_ref = $8,
        owner_token = NULL, lease_until = NULL, updated_at = (SELECT coalesce($4::timestamptz, now()))
    WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND owner_token = $5 RETURNING attempts, created_at

-- Stores a definitive failure under the owner token and ends the lease.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 owner token,
-- $6 error code, $7 error message, $8 the failure's status code (0: none), $9 its body.
-- The time is a subquery, evaluated once: Citus refuses COALESCE over a function that is
-- not immutable in an UPDATE, and accepts it there.
UPDATE {{records}} SET state = 'failed', error_code = $6, error_message = $7, status_code = $8, body = $9,
        owner_token = NULL, lease_until = NULL, updated_at = (SELECT coalesce($4::timestamptz, now()))
    WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND owner_token = $5 RETURNING attempts, created_at

-- Renews the lease from now.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 owner token,
-- $6 lease.
-- The times are subqueries, evaluated once: Citus refuses COALESCE over a function that is
-- not immutable in an UPDATE, and accepts it in a subquery, when nothing outside the
-- subquery but comparisons and greatest() works on its value.
UPDATE {{records}} SET lease_until = (SELECT coalesce($4::timestamptz, now()) + $6::interval), updated_at = (SELECT coalesce($4::timestamptz, now())),
        expires_at = greatest(expires_at, (SELECT coalesce($4::timestamptz, now()) + $6::interval))
    WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND owner_token = $5 RETURNING lease_until

-- The local mode's claim, sent with the mutation's first statement: the advisory lock is
-- tried, not waited for, and a live record looked for only when it is held. Either refusal
-- divides by zero, so that PostgreSQL skips the statements pipelined behind the claim.
-- $1 advisory lock, $2 tenant, $3 operation, $4 key, $5 now (NULL: the database clock).
SELECT 1 / CASE
    WHEN NOT pg_try_advisory_xact_lock($1) THEN 0
    WHEN EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $2 AND operation = $3 AND key = $4
        AND expires_at > coalesce($5::timestamptz, now())) THEN 0
    ELSE 1 END

-- The local mode's claim, sent with the mutation's first statement, after claim_lock,
-- which tried the advisory lock: a live record is looked for only when it is held. Either refusal
-- divides by zero, so that PostgreSQL skips the statements pipelined behind the claim.
-- $1 advisory lock, $2 tenant, $3 operation, $4 key, $5 now (NULL: the database clock).
SELECT 1 / CASE
    WHEN current_setting('oncekit.claim', true) IS DISTINCT FROM $1::int8::text THEN 0
    WHEN EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $2 AND operation = $3 AND key = $4
        AND expires_at > coalesce($5::timestamptz, now())) THEN 0
    ELSE 1 END

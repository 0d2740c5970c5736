-- The same claim answering true or false, for a claim sent before the mutation: a refusal
-- leaves the transaction healthy, so its rollback can travel with the lookup that follows.
-- $1 advisory lock, $2 tenant, $3 operation, $4 key, $5 now (NULL: the database clock).
SELECT CASE
    WHEN current_setting('oncekit.claim', true) IS DISTINCT FROM $1::int8::text THEN false
    WHEN EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $2 AND operation = $3 AND key = $4
        AND expires_at > coalesce($5::timestamptz, now())) THEN false
    ELSE true END

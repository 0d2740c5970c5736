-- Waits for the key's advisory lock for at most $2 (a lock_timeout) and keeps it until
-- the transaction ends; lock_timeout is set for the wait alone and put back before the
-- statement returns. A wait that runs out fails with lock_not_available (55P03), and the
-- rollback that follows undoes the setting too.
-- The lock lives where the claim (claim_local, claim_check) takes it: on the node that
-- holds the key's record. The statement names the records table with the key's tenant
-- for that alone: on Citus a statement without a distributed table runs on the
-- coordinator, while one filtered on the tenant is routed, whole, to the worker holding
-- that tenant's shard, with the functions it calls; on a single PostgreSQL the lookup
-- of the key by its primary key costs an index probe, on the waiting path only.
-- $1 advisory lock, $2 lock_timeout, $3 tenant, $4 operation, $5 key.
SELECT CASE WHEN pg_advisory_xact_lock($1)::text IS NULL THEN NULL
    ELSE set_config('lock_timeout', w.old, true) END
FROM (SELECT current_setting('lock_timeout') AS old, set_config('lock_timeout', $2, true) AS wait OFFSET 0) w
WHERE EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $3 AND operation = $4 AND key = $5) IS NOT NULL

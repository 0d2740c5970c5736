-- ClaimTx's bound on its wait for another transaction's uncommitted record of the key:
-- keeps the transaction's lock_timeout aside (in oncekit.lock_timeout) and sets $1;
-- restore_lock_timeout puts it back. Both name the records table with the key's tenant
-- for one reason, as wait_lock does: on Citus a statement filtered on the tenant is
-- routed, whole, to the worker that holds the tenant's shard, where the claim's INSERT
-- waits, and a setting made on the coordinator would not reach it. On a single
-- PostgreSQL the lookup costs an index probe, on ClaimTx's path only.
-- $1 lock_timeout, $2 tenant, $3 operation, $4 key.
SELECT set_config('oncekit.lock_timeout', current_setting('lock_timeout'), true), set_config('lock_timeout', $1, true)
WHERE EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $2 AND operation = $3 AND key = $4) IS NOT NULL

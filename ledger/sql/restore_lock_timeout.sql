-- Puts back the lock_timeout that keep_lock_timeout kept aside, on the same node.
-- $1 tenant, $2 operation, $3 key.
SELECT set_config('lock_timeout', current_setting('oncekit.lock_timeout'), true)
WHERE EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3) IS NOT NULL

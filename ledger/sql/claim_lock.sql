-- Tries the key's advisory lock without waiting, in the statement before the claim
-- (claim_local, claim_check). Under READ COMMITTED each statement takes its snapshot as
-- it starts, so a claim that tried the lock itself would look for the key's record with
-- a snapshot from before the lock, and miss the record of an attempt that committed in
-- between and then let the lock go. Taken here, the lock is held before the claim's
-- snapshot is: every attempt that held it has finished, and its record is visible. The
-- setting oncekit.claim, local to the transaction, tells the claim the lock is held
-- (the lock's number; '' when the try failed).
-- The lock lives where the claim takes it: on the node that holds the key's record. The
-- statement names the records table with the key's tenant for that alone (see
-- wait_lock.sql); on a single PostgreSQL that costs an index probe.
-- $1 advisory lock, $2 tenant, $3 operation, $4 key.
SELECT set_config('oncekit.claim', CASE WHEN pg_try_advisory_xact_lock($1::int8) THEN $1::int8::text ELSE '' END, true)
FROM (SELECT 1 OFFSET 0) o
WHERE EXISTS (SELECT 1 FROM {{records}} WHERE tenant = $2 AND operation = $3 AND key = $4) IS NOT NULL

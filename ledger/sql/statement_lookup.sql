-- DoStatement's look-up: the record of a key, read by lookup.sql (put in place of the
-- lookup mark below, without its comments), after trying the key's advisory lock without
-- waiting. The guarded statement that follows in the same round trip runs in the same
-- transaction (the pipeline's, implicit, up to its Sync), so a lock taken here is held
-- before that statement takes its snapshot: every attempt that finished under the lock
-- before then is visible to its look for a record. The setting oncekit.claim, local to
-- the transaction, tells it the lock is held ('' when the try failed). The lateral
-- reference makes the try run once, whether or not a record exists.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock), $5 the key's lock.
SELECT r.* FROM (SELECT set_config('oncekit.claim', CASE WHEN pg_try_advisory_xact_lock($5::int8) THEN $5::int8::text ELSE '' END, true) AS claimed OFFSET 0) c,
    LATERAL ({{lookup}} AND c.claimed IS NOT NULL) r

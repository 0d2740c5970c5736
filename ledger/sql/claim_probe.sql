-- Follows the claim in a caller's transaction. Under REPEATABLE READ or SERIALIZABLE it
-- finds, before the mutation runs, a record another transaction committed after the
-- caller's snapshot was taken: inserting a placeholder for the key then fails with
-- serialization_failure (40001). The placeholder (attempts 0) lives only inside the
-- caller's transaction: the record replaces it at the end, and a rollback removes it.
-- Under READ COMMITTED, whose statements see every committed record, it inserts nothing.
-- $1 tenant, $2 operation, $3 key, $4 now (NULL: the database clock).
INSERT INTO {{records}} (tenant, operation, key, fingerprint, state, attempts, created_at, updated_at, expires_at)
    SELECT $1, $2, $3, '', 'pending', 0, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now())
    WHERE current_setting('transaction_isolation') <> 'read committed'
    ON CONFLICT (tenant, operation, key) DO NOTHING

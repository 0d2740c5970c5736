-- oncekit ledger, migration 001: the dedup records.
--
-- Plain SQL, safe to run more than once. Table names are unqualified: run it with
-- search_path set to the ledger's schema (oncekit by default), for example
--   CREATE SCHEMA IF NOT EXISTS oncekit; SET search_path TO oncekit;
-- ledger.Migrate does exactly that, in one transaction per file.

CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant        text        NOT NULL,
    operation     text        NOT NULL,
    key           text        NOT NULL,
    -- Versioned SHA-256 of the request; the same key with another fingerprint is refused.
    fingerprint   text        NOT NULL,
    state         text        NOT NULL,
    -- The stored result: an application status code and body, or a definitive error.
    status_code   integer     NOT NULL DEFAULT 0,
    body          bytea,
    error_code    text,
    error_message text,
    resource_ref  text,
    -- Set while pending in the external-effect mode: only the owner may finish the record.
    owner_token   uuid,
    lease_until   timestamptz,
    -- An external call may have happened: the next owner must re-drive it with the same key.
    uncertain     boolean     NOT NULL DEFAULT false,
    attempts      integer     NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    -- Past this instant the record counts as absent and a retry is a new intent.
    expires_at    timestamptz NOT NULL,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (tenant, operation, key),
    CONSTRAINT idempotency_records_state_check CHECK (state IN ('pending', 'completed', 'failed'))
);

-- The purger walks expired records oldest first.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx ON idempotency_records (expires_at);

-- oncekit_claim claims a key for a local-mutation transaction: it serialises attempts on
-- the key with a transaction-scoped advisory lock (waiting at most p_wait_ms, or not at
-- all when it is 0), removes an expired record, and raises unique_violation on the
-- primary key when a live record holds the key. The record itself is inserted, with its
-- result, just before the transaction commits.
CREATE OR REPLACE FUNCTION oncekit_claim(p_tenant text, p_operation text, p_key text, p_now timestamptz, p_wait_ms integer)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    v_lock  bigint := hashtextextended(p_tenant || E'\x1f' || p_operation || E'\x1f' || p_key,
                                       'idempotency_records'::regclass::oid::bigint);
    v_saved   text;
    v_expires timestamptz;
BEGIN
    IF p_wait_ms <= 0 THEN
        IF NOT pg_try_advisory_xact_lock(v_lock) THEN
            RAISE EXCEPTION 'oncekit: key is held by another attempt' USING ERRCODE = 'lock_not_available';
        END IF;
    ELSE
        v_saved := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
        PERFORM pg_advisory_xact_lock(v_lock);
        PERFORM set_config('lock_timeout', v_saved, true);
    END IF;
    SELECT expires_at INTO v_expires FROM idempotency_records
     WHERE tenant = p_tenant AND operation = p_operation AND key = p_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_expires > v_now THEN
        RAISE EXCEPTION 'oncekit: key already has a record' USING
            ERRCODE = 'unique_violation', CONSTRAINT = 'idempotency_records_pkey';
    END IF;
    -- An expired record counts as absent: make way for the new intent.
    DELETE FROM idempotency_records
     WHERE tenant = p_tenant AND operation = p_operation AND key = p_key;
END;
$$;

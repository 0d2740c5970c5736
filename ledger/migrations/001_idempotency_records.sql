-- oncekit, line ledger, migration 001: the dedup records.
--
-- Plain SQL, safe to run more than once. Table names are unqualified: run it with
-- search_path set to oncekit's schema (oncekit by default), for example
--   CREATE SCHEMA IF NOT EXISTS oncekit; SET search_path TO oncekit;
-- migrate.Up does exactly that, in one transaction per file.

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

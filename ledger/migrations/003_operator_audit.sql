-- oncekit, line ledger, migration 003: operators' changes to records are kept, and
-- pending records are counted without reading the rest.
--
-- Plain SQL, safe to run more than once; run it with search_path set to the ledger's
-- schema, as migration 001.

-- A row per record an operator released or evicted (Ledger.Change, the oncekit
-- command's release and evict): who, when, why, and the record as it was. The stored
-- body is not copied: the row keeps its size and SHA-256, so that an audit row outliving
-- the record keeps no customer data.
CREATE TABLE IF NOT EXISTS idempotency_audit (
    id        bigserial   NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    tenant    text        NOT NULL,
    operation text        NOT NULL,
    key       text        NOT NULL,
    action    text        NOT NULL,
    -- Who made the change, as the operator's tool names them, and the database role it
    -- connected as.
    actor     text        NOT NULL,
    db_user   text        NOT NULL DEFAULT current_user,
    reason    text        NOT NULL,
    -- A pending record whose lease was live was released anyway.
    forced    boolean     NOT NULL DEFAULT false,
    before    jsonb       NOT NULL,
    CONSTRAINT idempotency_audit_pkey PRIMARY KEY (id),
    CONSTRAINT idempotency_audit_action_check CHECK (action IN ('release', 'evict'))
);
CREATE INDEX IF NOT EXISTS idempotency_audit_record_idx ON idempotency_audit (tenant, operation, key, id);

-- Pending records, for the oncekit.ledger.pending gauge and for finding stuck ones. Only
-- external-effect claims are ever committed pending, so the index stays small, but
-- building it reads the whole table under a lock that holds writes back: on a large
-- table, create it first with CREATE INDEX CONCURRENTLY (same name and definition), and
-- this statement then finds it.
CREATE INDEX IF NOT EXISTS idempotency_records_pending_idx ON idempotency_records (lease_until) WHERE state = 'pending';

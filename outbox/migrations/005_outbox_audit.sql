-- oncekit, line outbox, migration 005: operators' retries of dead events are kept.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001.

-- A row per dead event an operator made pending again (Outbox.RetryDead, the oncekit
-- command's outbox retry): who, when, why, and the event as it was. The payload is not
-- copied, so that a row outliving the event keeps no customer data.
CREATE TABLE IF NOT EXISTS outbox_audit (
    id         bigserial   NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    event_id   uuid        NOT NULL,
    topic      text        NOT NULL,
    action     text        NOT NULL,
    -- Who made the change, as the operator's tool names them, and the database role it
    -- connected as.
    actor      text        NOT NULL,
    db_user    text        NOT NULL DEFAULT current_user,
    reason     text        NOT NULL,
    -- The event as it was: its attempts and last error when it died.
    attempts   integer     NOT NULL,
    last_error text,
    CONSTRAINT outbox_audit_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_audit_action_check CHECK (action IN ('retry'))
);
CREATE INDEX IF NOT EXISTS outbox_audit_event_idx ON outbox_audit (event_id, id);

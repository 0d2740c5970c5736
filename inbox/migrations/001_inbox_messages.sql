-- oncekit, line inbox, migration 001: the consumer inbox.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001.

-- A row per message a subscriber has handled. It commits with the handler's writes, so
-- a message whose handler failed leaves no row and is handled on redelivery.
CREATE TABLE IF NOT EXISTS inbox_messages (
    subscriber  text        NOT NULL,
    message_id  text        NOT NULL,
    state       text        NOT NULL DEFAULT 'processed',
    error       text,
    received_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CONSTRAINT inbox_messages_pkey PRIMARY KEY (subscriber, message_id),
    CONSTRAINT inbox_messages_state_check CHECK (state IN ('processed', 'rejected'))
);
CREATE INDEX IF NOT EXISTS inbox_messages_expires_at_idx ON inbox_messages (expires_at);

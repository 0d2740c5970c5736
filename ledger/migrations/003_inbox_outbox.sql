-- oncekit, migration 003: the consumer inbox and the transactional outbox.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as migration 001.

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

-- Events enqueued in business transactions, published by dispatchers.
CREATE TABLE IF NOT EXISTS outbox_events (
    seq          bigserial   NOT NULL,
    id           uuid        NOT NULL,
    topic        text        NOT NULL,
    ordering_key text,
    payload      bytea       NOT NULL,
    state        text        NOT NULL DEFAULT 'pending',
    attempts     integer     NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    last_error   text,
    CONSTRAINT outbox_events_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_events_state_check CHECK (state IN ('pending', 'published', 'dead'))
);
-- Dispatchers scan pending events in order of enqueueing.
CREATE INDEX IF NOT EXISTS outbox_events_pending_idx ON outbox_events (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_events_ordering_idx ON outbox_events (ordering_key, seq) WHERE state = 'pending';

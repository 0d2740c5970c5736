-- oncekit, line outbox, migration 001: the transactional outbox.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001.

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

-- oncekit, line outbox, migration 003: each claim names its owner, so that a dispatcher
-- whose lease ran out cannot renew, release or record outcomes over the dispatcher that
-- took its events over; events keep the producer's trace context; dead events have an
-- index, so that the backlog is counted without reading published events.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001.

-- The claim's owner token, set with locked_until. Every renewal, release and outcome of
-- a dispatcher names it and counts the rows it touched.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS locked_by uuid;
-- The producer's trace context (W3C traceparent and whatever else the propagator
-- writes), from Enqueue; NULL without one.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS trace_context jsonb;
CREATE INDEX IF NOT EXISTS outbox_events_dead_idx ON outbox_events (seq) WHERE state = 'dead';

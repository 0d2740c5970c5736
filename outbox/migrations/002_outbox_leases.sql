-- oncekit, line outbox, migration 002: outbox dispatchers claim events with a lease instead of
-- holding row locks while they publish, so a stuck publication holds up no one else.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001.

ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS locked_until timestamptz;

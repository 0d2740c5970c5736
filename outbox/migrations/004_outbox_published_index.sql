-- oncekit, line outbox, migration 004: published events have an index in the order the
-- purge deletes them, so that each purge statement reads the oldest published events
-- instead of the whole table. Without it a purge of millions of events reads the table
-- once per batch.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, as the ledger's migration 001. On a large outbox, create the index with
-- CREATE INDEX CONCURRENTLY, outside a transaction, before applying this file (which
-- then does nothing), so that producers are not held up while it is built.

CREATE INDEX IF NOT EXISTS outbox_events_published_idx ON outbox_events (published_at) WHERE state = 'published';

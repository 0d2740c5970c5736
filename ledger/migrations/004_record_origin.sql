-- oncekit:no-transaction
-- oncekit, line ledger, migration 004: records carry where their intent came from (the
-- Temporal workflow ID, run ID, workflow type and activity type), so that an operator
-- finds a workflow's records from its workflow ID whatever their keys are made of.
--
-- Plain SQL, safe to run more than once; run it with search_path set to the ledger's
-- schema, as migration 001, and OUTSIDE a transaction (the marker on the first line says
-- so to migrate.Up), one statement at a time: CREATE INDEX CONCURRENTLY refuses to run
-- in one. The columns are nullable and have no default, so adding them rewrites nothing
-- (a change of the catalog, under a lock held for an instant; it waits, and holds writes
-- back meanwhile, for transactions already using the table). The indexes are built
-- while writes go on. They hold only records with an origin, so a record written without
-- one costs no index entry. A build that failed leaves an INVALID index, which
-- IF NOT EXISTS then skips: migrate.Up refuses to record the migration while one is
-- there; drop it (DROP INDEX CONCURRENTLY name) and run again.

ALTER TABLE idempotency_records
    ADD COLUMN IF NOT EXISTS workflow_id text,
    ADD COLUMN IF NOT EXISTS run_id text,
    ADD COLUMN IF NOT EXISTS workflow_type text,
    ADD COLUMN IF NOT EXISTS activity_type text;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_records_workflow_id_idx
    ON idempotency_records (workflow_id) WHERE workflow_id IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_records_run_id_idx
    ON idempotency_records (run_id) WHERE run_id IS NOT NULL;

-- Newest first within a type, as the oncekit command lists.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_records_activity_type_idx
    ON idempotency_records (activity_type, created_at) WHERE activity_type IS NOT NULL;

-- oncekit, line ledger, migration 002: the local mode no longer calls oncekit_claim(), a
-- function that versions before 0.2 created; its claim is one prepared statement sent
-- with the mutation's first statement.
--
-- Plain SQL, safe to run more than once; run it with search_path set to the ledger's
-- schema, as migration 001.

DROP FUNCTION IF EXISTS oncekit_claim(text, text, text, timestamptz, integer);

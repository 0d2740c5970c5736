-- The guarded single statement (DoStatement): the caller's statement and the key's
-- completed record in one statement, committed by itself. The first line's WITH list
-- holds the statement's own common table expressions (RECURSIVE if its WITH was), then
-- its main statement, whose rows become oncekit_w. The ledger's parameters follow the
-- statement's own, each named here by what it holds.
--
-- The record's body is the claim: its CASE first checks that the look-up sent ahead of
-- it in the same transaction took the key's advisory lock (the setting oncekit.claim
-- names the lock then; see statement_lookup.sql), so that this statement's snapshot was
-- taken under the lock, and looks for a record of the key; either refusal fails a cast to integer
-- with a message that names it (invalid_text_representation, 22P02), which aborts the
-- statement before the CASE's last branch, the only place that reads oncekit_w, is
-- evaluated. PostgreSQL runs a data-modifying WITH query when a reader pulls its rows
-- or, if none does, when the main statement has finished; an error before either stops
-- it from running at all. The refusals name the backend, a stable function, so that no
-- plan folds them into a constant and fails while planning. Past the claim, the rows
-- become the body, a JSON array of row_to_json objects; a body over the ledger's limit
-- fails the cast to integer with a message that names its size.
--
-- The statement has two forms; the first leaves out the parts marked "replace". The first
-- form, sent first, refuses any record of the key and inserts without a conflict clause
-- (a speculative insertion costs a WAL record of its own): a record that appears after
-- the look (written by an attempt that takes no claim) fails the primary key
-- (unique_violation, 23505). The second form, sent once the look-up in the same round
-- trip has shown the key's record expired, refuses only a live record and replaces the
-- expired one; meeting a live one it sets a state the table's check refuses
-- (check_violation, 23514). Either way the whole statement rolls back.
{{with}} oncekit_w AS ({{main}})
INSERT INTO {{records}} AS r (tenant, operation, key, fingerprint, state, status_code, body, attempts, created_at, updated_at, expires_at,
        workflow_id, run_id, workflow_type, activity_type)
    VALUES ({{tenant}}, {{operation}}, {{key}}, {{fingerprint}}, 'completed', {{code}},
        CASE WHEN current_setting('oncekit.claim', true) IS DISTINCT FROM {{lock}}::text THEN ('oncekit_claim_refused=' || pg_backend_pid())::int::text::bytea
            WHEN EXISTS (SELECT 1 FROM {{records}} WHERE tenant = {{tenant}} AND operation = {{operation}} AND key = {{key}}
                {{replace}}AND expires_at > coalesce({{now}}, now()){{/replace}}) THEN ('oncekit_claim_refused=' || pg_backend_pid())::int::text::bytea
            ELSE (SELECT CASE WHEN octet_length(oncekit_j.j) > {{max}} THEN ('oncekit_body_bytes=' || octet_length(oncekit_j.j))::int::text::bytea
                    ELSE convert_to(oncekit_j.j, 'UTF8') END
                FROM (SELECT coalesce('[' || string_agg(row_to_json(oncekit_w.*)::text, ',') || ']', '[]') AS j FROM oncekit_w) oncekit_j)
        END,
        1, {{at}}, coalesce({{now}}, now()), greatest({{at}}, coalesce({{now}}, now())) + {{retention}},
        {{workflow_id}}, {{run_id}}, {{workflow_type}}, {{activity_type}})
    {{replace}}ON CONFLICT (tenant, operation, key) DO UPDATE SET
        state = CASE WHEN r.expires_at <= excluded.updated_at THEN excluded.state ELSE 'taken' END,
        fingerprint = excluded.fingerprint, status_code = excluded.status_code, body = excluded.body,
        error_code = NULL, error_message = NULL, resource_ref = NULL, owner_token = NULL,
        lease_until = NULL, uncertain = false, attempts = 1, created_at = excluded.created_at,
        updated_at = excluded.updated_at, expires_at = excluded.expires_at, workflow_id = excluded.workflow_id,
        run_id = excluded.run_id, workflow_type = excluded.workflow_type, activity_type = excluded.activity_type{{/replace}}
    RETURNING r.body

-- oncekit, line agent, migration 001: the frozen tool calls of agents.
--
-- Plain SQL, safe to run more than once; run it with search_path set to oncekit's
-- schema, after the ledger's line.

-- A row per tool call an agent made: its place in the task, the canonical arguments
-- it was first made with, and, for a call that needs a person's approval, the
-- decision. It is written in the transaction that claims the call's ledger key, so a
-- call whose arguments changed on a retry can be shown beside the first ones.
CREATE TABLE IF NOT EXISTS agent_calls (
    tenant            text        NOT NULL,
    call_key          text        NOT NULL,
    task_id           text        NOT NULL,
    step              text        NOT NULL,
    tool              text        NOT NULL,
    args              text        NOT NULL,
    fingerprint       text        NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    approval          text        NOT NULL DEFAULT 'none',
    approval_deadline timestamptz,
    decided_by        text,
    decided_reason    text,
    decided_at        timestamptz,
    CONSTRAINT agent_calls_pkey PRIMARY KEY (tenant, call_key),
    CONSTRAINT agent_calls_approval_check CHECK (approval IN ('none', 'waiting', 'approved', 'rejected'))
);
CREATE INDEX IF NOT EXISTS agent_calls_waiting_idx ON agent_calls (tenant, approval_deadline) WHERE approval = 'waiting';
CREATE INDEX IF NOT EXISTS agent_calls_expires_at_idx ON agent_calls (expires_at);

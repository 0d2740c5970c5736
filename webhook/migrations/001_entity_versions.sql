-- oncekit, line webhook, migration 001: the newest applied version of each entity, so that an
-- older event arriving after a newer one can be recognised and ignored.
--
-- Plain SQL, safe to run more than once; run it with search_path set to the ledger's
-- schema, as the ledger's migration 001.

CREATE TABLE IF NOT EXISTS entity_versions (
    tenant     text        NOT NULL,
    scope      text        NOT NULL,
    entity     text        NOT NULL,
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT entity_versions_pkey PRIMARY KEY (tenant, scope, entity)
);

-- Pending records whose lease is live, and those whose lease ran out, from the partial
-- index of pending records: for the oncekit.ledger.pending gauge.
-- $1 now (NULL: the database clock).
SELECT count(*) FILTER (WHERE lease_until > coalesce($1::timestamptz, now())),
    count(*) FILTER (WHERE lease_until IS NULL OR lease_until <= coalesce($1::timestamptz, now()))
FROM {{records}} WHERE state = 'pending'

-- Counts by state and operation, for operators: the oldest pending record, pending
-- records whose lease ran out, records past their retention, and of those the ones a
-- purge deletes (not a pending record whose lease is live).
-- $1 now (NULL: the database clock).
SELECT state, operation, count(*),
    min(created_at) FILTER (WHERE state = 'pending'),
    count(*) FILTER (WHERE state = 'pending' AND lease_until <= coalesce($1::timestamptz, now())),
    count(*) FILTER (WHERE expires_at <= coalesce($1::timestamptz, now())),
    count(*) FILTER (WHERE expires_at <= coalesce($1::timestamptz, now())
        AND (state <> 'pending' OR lease_until IS NULL OR lease_until <= coalesce($1::timestamptz, now())))
FROM {{records}}
GROUP BY state, operation
ORDER BY state, operation

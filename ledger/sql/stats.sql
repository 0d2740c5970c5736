-- Counts by state and operation, for operators: the oldest pending record, pending
-- records whose lease ran out, and records past their retention.
-- $1 now (NULL: the database clock).
SELECT state, operation, count(*),
    min(created_at) FILTER (WHERE state = 'pending'),
    count(*) FILTER (WHERE state = 'pending' AND lease_until <= coalesce($1::timestamptz, now())),
    count(*) FILTER (WHERE expires_at <= coalesce($1::timestamptz, now()))
FROM {{records}}
GROUP BY state, operation
ORDER BY state, operation

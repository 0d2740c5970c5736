-- Deletes a completed or failed record, for an operator.
-- $1 tenant, $2 operation, $3 key.
DELETE FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3 AND state IN ('completed', 'failed')

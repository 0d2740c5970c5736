-- Deletes a pending record whatever its owner, for an operator.
-- $1 tenant, $2 operation, $3 key.
DELETE FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending'

-- Gives the key up: the call did not happen.
-- $1 tenant, $2 operation, $3 key, $4 owner token.
DELETE FROM {{records}} WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'pending' AND owner_token = $4

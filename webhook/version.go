package webhook

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
)

// advanceVersion records version as the newest applied version of entity within scope,
// in the receiver's entity_versions table, when it is newer than the one recorded, and
// reports whether it was. Concurrent calls for one entity serialise on its row, so
// exactly one of two equal versions wins.
func advanceVersion(ctx context.Context, tx pgx.Tx, schema string, scope keys.Scope, entity string, version int64) (bool, error) {
	if err := scope.Validate(); err != nil {
		return false, err
	}
	if entity == "" {
		return false, errors.New("oncekit/webhook: Newer needs an entity")
	}
	t := pgx.Identifier{schema, "entity_versions"}.Sanitize()
	var applied bool
	err := tx.QueryRow(ctx, `INSERT INTO `+t+` AS v (tenant, scope, entity, version, updated_at) VALUES ($1, $2, $3, $4, now())
		ON CONFLICT (tenant, scope, entity) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at
		WHERE v.version < excluded.version
		RETURNING true`, scope.Tenant, scope.Operation, entity, version).Scan(&applied)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return applied, err
}

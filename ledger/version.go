package ledger

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
)

// AdvanceVersionTx records version as the newest applied version of entity within
// scope, when it is newer than the one recorded, and reports whether it was. Call it in
// the transaction that applies an event: an event older than (or as old as) one already
// applied reports false and should be ignored. Concurrent calls for one entity
// serialise on its row, so exactly one of two equal versions wins.
func (l *Ledger) AdvanceVersionTx(ctx context.Context, tx pgx.Tx, scope keys.Scope, entity string, version int64) (bool, error) {
	if err := scope.Validate(); err != nil {
		return false, err
	}
	if entity == "" {
		return false, errors.New("oncekit/ledger: AdvanceVersionTx needs an entity")
	}
	t := pgx.Identifier{l.cfg.Schema, "entity_versions"}.Sanitize()
	var applied bool
	err := tx.QueryRow(ctx, `INSERT INTO `+t+` AS v (tenant, scope, entity, version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant, scope, entity) DO UPDATE SET version = excluded.version, updated_at = now()
		WHERE v.version < excluded.version
		RETURNING true`, scope.Tenant, scope.Operation, entity, version).Scan(&applied)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return applied, err
}

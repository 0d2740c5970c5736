package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Table says where Citus keeps one of a line's tables: distributed by Column, the
// tenant of each row, so that a tenant's rows live in one shard beside the tenant's
// business rows; or, with Column empty, for a table whose rows name no tenant, on the
// coordinator as a Citus local table. Citus knows a local table's writes, so a
// transaction that writes it and a worker's shard commits both with two-phase commit;
// writes to it take no cluster-wide lock, as writes to a reference table would (Citus
// serialises every update, delete and upsert of a reference table, to keep its copies
// alike); and FOR UPDATE SKIP LOCKED works on it, which Citus refuses across the shards
// of a distributed table.
type Table struct {
	Name, Column string
}

// ErrNotCitus is returned by [Place] on a database without the citus extension.
var ErrNotCitus = errors.New("oncekit: the database has no citus extension: placing tables needs Citus (CREATE EXTENSION citus on the coordinator and on every worker)")

// Place hands the lines' tables in schema to Citus, as each [Table] says. Distributed
// tables join one colocation group: colocateWith's (a distributed table, as regclass
// reads it) when it is given, otherwise Citus's default group for the column's type and
// the coordinator's shard count, which a user's table distributed by a text tenant
// column with the default shard count also joins. A table Citus already holds stays
// where it is, except that with colocateWith a distributed table in another group
// moves to colocateWith's. Tables the schema does not have are left alone. Place
// returns the tables it placed or moved, schema-qualified, and [ErrNotCitus] on a
// database without Citus.
func Place(ctx context.Context, db Beginner, schema, colocateWith string, lines ...Line) ([]string, error) {
	var changed []string
	for _, l := range lines {
		for _, t := range l.Tables {
			did, err := place(ctx, db, schema, colocateWith, t)
			if err != nil {
				how := "as a Citus local table"
				if t.Column != "" {
					how = "by " + t.Column
				}
				return changed, fmt.Errorf("oncekit: place %s.%s %s: %w", schema, t.Name, how, err)
			}
			if did {
				changed = append(changed, schema+"."+t.Name)
			}
		}
	}
	return changed, nil
}

func place(ctx context.Context, db Beginner, schema, colocateWith string, t Table) (did bool, err error) {
	name := pgx.Identifier{schema, t.Name}.Sanitize()
	err = whenFree(ctx, func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var citus, exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus'), to_regclass($1) IS NOT NULL`,
				name).Scan(&citus, &exists); err != nil {
				return err
			}
			if !citus {
				return ErrNotCitus
			}
			if !exists {
				return nil
			}
			if err := tryLock(ctx, tx, schema, "pg_try_advisory_xact_lock"); err != nil {
				return err
			}
			// partmethod: 'h' hash-distributed, 'n' a reference or Citus local table.
			var method *string
			var group *int64
			if err := tx.QueryRow(ctx, `SELECT partmethod::text, colocationid FROM pg_dist_partition WHERE logicalrelid = $1::regclass`,
				name).Scan(&method, &group); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			switch {
			case t.Column == "" && method == nil:
				did = true
				// The coordinator must be in the metadata (citus_set_coordinator_host).
				_, err := tx.Exec(ctx, `SELECT citus_add_local_table_to_metadata($1::regclass)`, name)
				return err
			case t.Column == "":
				return nil
			case method == nil:
				target := colocateWith
				if target == "" {
					target = "default"
				}
				did = true
				_, err := tx.Exec(ctx, `SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)`, name, t.Column, target)
				return err
			case *method != "h":
				return fmt.Errorf("the table is held by Citus already, not distributed (partition method %q): undistribute it (undistribute_table) and run again", *method)
			case colocateWith != "":
				var same bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass AND colocationid = $2)`,
					colocateWith, *group).Scan(&same); err != nil {
					return err
				}
				if same {
					return nil
				}
				did = true
				_, err := tx.Exec(ctx, `SELECT update_distributed_table_colocation($1::regclass, colocate_with => $2)`, name, colocateWith)
				return err
			}
			return nil
		})
	})
	return did, err
}

// Package migrate sets up oncekit's tables in one call. Each feature keeps its own
// migration line next to the code that queries it: the ledger's records, the webhook
// receiver's entity versions, the inbox, the outbox and the agents' tool calls. Up
// applies them all, in that order, recording each file in the schema's
// oncekit_migrations table; Script gives the same as one plain SQL script for psql or
// another migration tool.
package migrate

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/migrate"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/shard"
	"github.com/oncekit/oncekit/webhook"
)

// Applied names one migration file that Up applied.
type Applied struct {
	Line    string
	Version int
	Name    string
}

// Result reports what Up did.
type Result struct {
	// Applied lists the files applied by this call; empty when the schema was current.
	Applied []Applied
}

func lines() []migrate.Line {
	return []migrate.Line{
		{Name: ledger.MigrationLine, Files: ledger.Migrations(), Tables: []migrate.Table{{Name: "idempotency_records", Column: "tenant"}}},
		{Name: webhook.MigrationLine, Files: webhook.Migrations(), Tables: []migrate.Table{{Name: "entity_versions", Column: "tenant"}}},
		// The inbox's and the outbox's rows name no tenant: they stay on the coordinator.
		{Name: inbox.MigrationLine, Files: inbox.Migrations(), Tables: []migrate.Table{{Name: "inbox_messages"}}},
		{Name: outbox.MigrationLine, Files: outbox.Migrations(), Tables: []migrate.Table{{Name: "outbox_events"}}},
		{Name: agent.MigrationLine, Files: agent.Migrations(), Tables: []migrate.Table{{Name: "agent_calls", Column: "tenant"}}},
	}
}

// Up creates schema (default ledger.SchemaDefault) if needed and applies every line's
// migrations not yet applied, each in its own transaction. It is safe to call from many
// processes at once: a transaction-scoped advisory lock serialises them. db is a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
//
// On a database with the citus extension (connect to the coordinator), Up then hands
// the tables to Citus as [Distribute] does without ColocateWith: the ledger's records
// and the webhook receiver's entity versions distributed by their tenant column, in
// Citus's default colocation group for text columns; the inbox's and the outbox's
// tables, whose rows name no tenant, as Citus local tables on the coordinator.
func Up(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema string) (Result, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	files, err := migrate.Up(ctx, db, schema, lines()...)
	var res Result
	for _, f := range files {
		res.Applied = append(res.Applied, Applied{Line: f.Line, Version: f.Version, Name: f.Name})
	}
	return res, err
}

// UpShards runs [Up] on every shard of r in turn, each in its own transactions, and
// returns what it applied by shard name. A shard that fails does not stop the others;
// the error names it, and running UpShards again finishes its work.
func UpShards(ctx context.Context, r *shard.Router, schema string) (map[string]Result, error) {
	results := map[string]Result{}
	err := r.Each(func(s shard.Shard) error {
		res, err := Up(ctx, s.Pool, schema)
		results[s.Name] = res
		return err
	})
	return results, err
}

// Versions returns the newest applied version of each migration line in schema (default
// ledger.SchemaDefault), such as {"ledger": 2, "outbox": 2}.
func Versions(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) (map[string]int, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	return migrate.Versions(ctx, q, schema)
}

// DistributeOpts are options of [Distribute]. A nil *DistributeOpts means all
// defaults.
type DistributeOpts struct {
	// ColocateWith names a distributed table of the user's (schema-qualified, as
	// regclass reads it, such as "public.orders"), distributed by a text column that
	// holds the tenant: the ledger's records and the webhook receiver's entity versions
	// join its colocation group, so that a guarded business transaction on one tenant
	// touches one shard. Defaults to "": Citus's default group for text columns, which a
	// table distributed by a text column with the default shard count joins too.
	ColocateWith string
}

// DistributeResult reports what [Distribute] did.
type DistributeResult struct {
	// Placed lists the tables (schema-qualified) that this call distributed, added to
	// Citus's metadata as local tables, or moved to ColocateWith's group; empty when
	// Citus held them all already as asked.
	Placed []string
}

// ErrNotCitus is returned by [Distribute] on a database without the citus extension.
var ErrNotCitus = migrate.ErrNotCitus

// Distribute hands oncekit's tables in schema (default ledger.SchemaDefault) to Citus:
// the ledger's records and the webhook receiver's entity versions are distributed by
// their tenant column and colocated as opts.ColocateWith says; the inbox's and the
// outbox's tables, whose rows name no tenant, become Citus local tables: they stay on
// the coordinator, which must be in Citus's metadata (citus_set_coordinator_host), and a
// message recorded or an event enqueued commits atomically with the tenant's business
// write on a worker, with two-phase commit. Dispatchers claim events there with FOR
// UPDATE SKIP LOCKED as on a single PostgreSQL.
// A table already distributed stays so; with ColocateWith it moves to that table's
// group when it is in another one. Run [Up] first; Up already distributes with the
// default colocation, so call Distribute to colocate with a table of your own. It
// returns [ErrNotCitus] on a database without the citus extension.
func Distribute(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema string, opts *DistributeOpts) (DistributeResult, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	o := DistributeOpts{}
	if opts != nil {
		o = *opts
	}
	placed, err := migrate.Place(ctx, db, schema, o.ColocateWith, lines()...)
	return DistributeResult{Placed: placed}, err
}

// Script returns every line as one plain SQL script for psql or another migration
// tool: it creates schema (default ledger.SchemaDefault), sets the search_path, and
// applies and records every file. Each file is safe to run more than once, so the script
// is too, and a schema it set up is one that Up finds current.
func Script(schema string) (string, error) {
	if schema == "" {
		schema = ledger.SchemaDefault
	}
	return migrate.Script(schema, lines()...)
}

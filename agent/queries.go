package agent

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// queries are the package's SQL, each a whole statement; {{calls}} stands for the
// schema-qualified agent_calls table. $n parameters are listed above each statement;
// a NULL "now" means the database's clock.
type queries struct {
	insert, read, decide, timeout, waiting, purgeable string
	// purge deletes expired calls; $2 is now.
	purge pgsql.Purge
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "agent_calls"}.Sanitize()
	r := func(s string) string { return strings.ReplaceAll(s, "{{calls}}", t) }
	return queries{
		purge: pgsql.PurgeSQL(t, []string{"tenant", "call_key"}, "expires_at <= coalesce($2::timestamptz, now())", "expires_at"),
		// $1 tenant, $2 call key, $3 task, $4 step, $5 tool, $6 canonical arguments,
		// $7 fingerprint, $8 now, $9 retention, $10 approval ('none' or 'waiting'),
		// $11 approval timeout. A row past its retention is a new call's.
		insert: r(`INSERT INTO {{calls}} AS c (tenant, call_key, task_id, step, tool, args, fingerprint, created_at, expires_at, approval, approval_deadline)
    VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8::timestamptz, now()), coalesce($8::timestamptz, now()) + $9::interval, $10,
        CASE WHEN $10 = 'waiting' THEN coalesce($8::timestamptz, now()) + $11::interval END)
    ON CONFLICT (tenant, call_key) DO UPDATE SET task_id = excluded.task_id, step = excluded.step, tool = excluded.tool,
        args = excluded.args, fingerprint = excluded.fingerprint, created_at = excluded.created_at, expires_at = excluded.expires_at,
        approval = excluded.approval, approval_deadline = excluded.approval_deadline, decided_by = NULL, decided_reason = NULL, decided_at = NULL
    WHERE c.expires_at <= excluded.created_at OR (c.approval = 'none' AND excluded.approval = 'waiting' AND c.fingerprint = excluded.fingerprint)`),
		// $1 tenant, $2 call key, $3 now.
		read: r(`SELECT task_id, step, tool, args, fingerprint, approval, approval_deadline,
        coalesce(approval_deadline <= coalesce($3::timestamptz, now()), false), coalesce(decided_by, ''), coalesce(decided_reason, '')
    FROM {{calls}} WHERE tenant = $1 AND call_key = $2`),
		// $1 tenant, $2 call key, $3 fingerprint, $4 decision, $5 by, $6 reason, $7 now.
		decide: r(`UPDATE {{calls}} SET approval = $4, decided_by = $5, decided_reason = $6, decided_at = coalesce($7::timestamptz, now())
    WHERE tenant = $1 AND call_key = $2 AND fingerprint = $3 AND approval = 'waiting' AND approval_deadline > coalesce($7::timestamptz, now())`),
		// $1 tenant, $2 call key, $3 now.
		timeout: r(`UPDATE {{calls}} SET approval = 'rejected', decided_reason = 'timeout', decided_at = coalesce($3::timestamptz, now())
    WHERE tenant = $1 AND call_key = $2 AND approval = 'waiting' AND approval_deadline <= coalesce($3::timestamptz, now())`),
		// $1 now.
		purgeable: r(`SELECT count(*) FROM {{calls}} WHERE expires_at <= coalesce($1::timestamptz, now())`),
		// $1 tenant, $2 now, $3 limit.
		waiting: r(`SELECT call_key, task_id, step, tool, args, fingerprint, approval_deadline FROM {{calls}}
    WHERE tenant = $1 AND approval = 'waiting' AND approval_deadline > coalesce($2::timestamptz, now())
    ORDER BY approval_deadline, call_key LIMIT $3`),
	}
}

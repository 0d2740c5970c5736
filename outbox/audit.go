package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/config"
)

// ActionRetry is the action of an audit row [Outbox.RetryDead] keeps.
const ActionRetry = "retry"

// AuditEntry is an operator's change to an event, as its audit row keeps it.
type AuditEntry struct {
	ID      int64
	At      time.Time
	EventID uuid.UUID
	Topic   string
	// Action is ActionRetry.
	Action string
	// Actor and Reason are RetryDeadOpts.Actor and Reason; DBUser the database role
	// the change was made as.
	Actor, DBUser, Reason string
	// Attempts and LastError are the event's when it was dead, before the retry reset
	// them.
	Attempts  int
	LastError string
}

// AuditOpts filter [Outbox.ListAudit]. A nil *AuditOpts lists the newest audit rows.
// Filters combine.
type AuditOpts struct {
	// EventID keeps the rows of this event. Defaults to uuid.Nil: any.
	EventID uuid.UUID
	// Topic keeps the rows of this topic's events. Defaults to "": any.
	Topic string
	// Actor keeps the rows of changes made by this actor. Defaults to "": any.
	Actor string
	// Since and Until keep the rows of changes made at or after Since and before
	// Until. Defaults to zero: no bound.
	Since, Until time.Time
	// Limit bounds the number of rows; a negative one is refused. Defaults to
	// [DeadLimitDefault].
	Limit int
}

// ListAudit returns the audit rows of operators' retries, newest first, filtered by
// opts, including those of events purged since.
func (o *Outbox) ListAudit(ctx context.Context, opts *AuditOpts) ([]AuditEntry, error) {
	c := config.Of(opts)
	if c.Limit < 0 {
		return nil, fmt.Errorf("oncekit/outbox: AuditOpts.Limit %d is negative", c.Limit)
	}
	limit := config.Or(c.Limit, DeadLimitDefault)
	var since, until *time.Time
	if !c.Since.IsZero() {
		since = &c.Since
	}
	if !c.Until.IsZero() {
		until = &c.Until
	}
	entries := []AuditEntry{}
	err := o.each(func(v *Outbox) error {
		rows, err := v.pool.Query(ctx, `SELECT id, at, event_id, topic, action, actor, db_user, reason, attempts, coalesce(last_error, '')
			FROM `+v.audit+` WHERE ($1::uuid = '00000000-0000-0000-0000-000000000000' OR event_id = $1) AND ($2 = '' OR topic = $2)
			AND ($3 = '' OR actor = $3) AND ($4::timestamptz IS NULL OR at >= $4) AND ($5::timestamptz IS NULL OR at < $5)
			ORDER BY at DESC, id DESC LIMIT $6`, c.EventID, c.Topic, c.Actor, since, until, limit)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
			var e AuditEntry
			return e, r.Scan(&e.ID, &e.At, &e.EventID, &e.Topic, &e.Action, &e.Actor, &e.DBUser, &e.Reason, &e.Attempts, &e.LastError)
		})
		entries = append(entries, got...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/outbox: list audit rows: %w", err)
	}
	// Each shard's rows are in order; merged, the newest limit of them.
	slices.SortStableFunc(entries, func(a, b AuditEntry) int {
		if d := b.At.Compare(a.At); d != 0 {
			return d
		}
		return cmp.Compare(b.ID, a.ID)
	})
	return entries[:min(len(entries), limit)], nil
}

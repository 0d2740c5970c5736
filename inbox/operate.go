package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SubscriberStats counts one subscriber's records, for operators.
type SubscriberStats struct {
	Subscriber string
	// Processed and Rejected count the records by state, expired or not.
	Processed int64
	Rejected  int64
	// Expired counts the records past their retention, which count as absent and which
	// [Inbox.Purge] deletes.
	Expired int64
	// LastReceived is when the newest record was written.
	LastReceived time.Time
}

// Stats counts the inbox's records by subscriber, in subscriber order.
func (ib *Inbox) Stats(ctx context.Context) ([]SubscriberStats, error) {
	rows, err := ib.pool.Query(ctx, `SELECT subscriber, count(*) FILTER (WHERE state = 'processed'),
		count(*) FILTER (WHERE state = 'rejected'), count(*) FILTER (WHERE expires_at <= now()), max(received_at)
		FROM `+pgx.Identifier{ib.cfg.Schema, "inbox_messages"}.Sanitize()+` GROUP BY subscriber ORDER BY subscriber`)
	if err != nil {
		return nil, fmt.Errorf("oncekit/inbox: stats: %w", err)
	}
	stats, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SubscriberStats, error) {
		var s SubscriberStats
		return s, r.Scan(&s.Subscriber, &s.Processed, &s.Rejected, &s.Expired, &s.LastReceived)
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/inbox: stats: %w", err)
	}
	if stats == nil {
		stats = []SubscriberStats{}
	}
	return stats, nil
}

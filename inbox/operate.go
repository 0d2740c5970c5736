package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/shard"
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

// Stats counts the inbox's records by subscriber, in subscriber order, over every shard.
func (ib *Inbox) Stats(ctx context.Context) ([]SubscriberStats, error) {
	by := map[string]*SubscriberStats{}
	err := ib.r.Each(func(s shard.Shard) error {
		rows, err := s.Pool.Query(ctx, `SELECT subscriber, count(*) FILTER (WHERE state = 'processed'),
			count(*) FILTER (WHERE state = 'rejected'), count(*) FILTER (WHERE expires_at <= now()), max(received_at)
			FROM `+pgx.Identifier{ib.cfg.Schema, "inbox_messages"}.Sanitize()+` GROUP BY subscriber`)
		if err != nil {
			return err
		}
		var st SubscriberStats
		_, err = pgx.ForEachRow(rows, []any{&st.Subscriber, &st.Processed, &st.Rejected, &st.Expired, &st.LastReceived}, func() error {
			sum, ok := by[st.Subscriber]
			if !ok {
				sum = &SubscriberStats{Subscriber: st.Subscriber}
				by[st.Subscriber] = sum
			}
			sum.Processed += st.Processed
			sum.Rejected += st.Rejected
			sum.Expired += st.Expired
			if st.LastReceived.After(sum.LastReceived) {
				sum.LastReceived = st.LastReceived
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/inbox: stats: %w", err)
	}
	stats := make([]SubscriberStats, 0, len(by))
	for _, s := range by {
		stats = append(stats, *s)
	}
	slices.SortFunc(stats, func(a, b SubscriberStats) int { return strings.Compare(a.Subscriber, b.Subscriber) })
	return stats, nil
}

// ErrNotFound: the inbox holds no record of the message.
var ErrNotFound = errors.New("oncekit/inbox: no record of this message")

// Record is one message's record, for operators.
type Record struct {
	Subscriber, MessageID string
	// State is "processed", or "rejected" for a message the handler refused for good.
	State string
	// Error is the rejection's reason; "" for a processed message.
	Error string
	// ReceivedAt is when the record was written; ExpiresAt when it stops counting, and
	// Expired whether it has: an expired record counts as absent, and the message would
	// be handled again.
	ReceivedAt, ExpiresAt time.Time
	Expired               bool
}

// Get returns the record of the message with messageID that subscriber received, looking
// on every shard, or [ErrNotFound]. A message whose handler failed leaves no record: it
// is handled again on redelivery.
func (ib *Inbox) Get(ctx context.Context, subscriber, messageID string) (*Record, error) {
	var found *Record
	err := ib.r.Each(func(s shard.Shard) error {
		if found != nil {
			return nil
		}
		r := Record{Subscriber: subscriber, MessageID: messageID}
		var reason *string
		err := s.Pool.QueryRow(ctx, `SELECT state, error, received_at, expires_at, expires_at <= now()
			FROM `+pgx.Identifier{ib.cfg.Schema, "inbox_messages"}.Sanitize()+` WHERE subscriber = $1 AND message_id = $2`,
			subscriber, messageID).Scan(&r.State, &reason, &r.ReceivedAt, &r.ExpiresAt, &r.Expired)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if reason != nil {
			r.Error = *reason
		}
		found = &r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/inbox: get %q of %q: %w", messageID, subscriber, err)
	}
	if found == nil {
		return nil, ErrNotFound
	}
	return found, nil
}

package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
)

// Operator calls: what the oncekit command runs for an on-call engineer. They read and
// change records whatever their owner, so they are not for application code.

// ListOpts filter [Ledger.List]. A nil *ListOpts lists the newest records.
type ListOpts struct {
	// State keeps records in this state. Defaults to every state.
	State State
	// Operation keeps records of this operation. Defaults to every operation.
	Operation string
	// Tenant keeps records of this tenant. Defaults to every tenant.
	Tenant string
	// OlderThan keeps records created at least this long ago. Defaults to 0: any age.
	OlderThan time.Duration
	// Stuck keeps pending records whose lease ran out and that no attempt took over.
	Stuck bool
	// Limit bounds the number of records. Defaults to 100.
	Limit int
}

// List returns records, newest first, filtered by opts.
func (l *Ledger) List(ctx context.Context, opts *ListOpts) ([]Record, error) {
	o := ListOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	rows, err := l.pool.Query(ctx, l.q.list, string(o.State), o.Operation, o.Tenant, o.OlderThan.Seconds(), o.Stuck, o.Limit, l.now())
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: list: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		var sc recordScan
		var key string
		err := row.Scan(append([]any{&r.Scope.Tenant, &r.Scope.Operation, &key}, sc.dest(&r)...)...)
		r.Key = keys.Key(key)
		sc.finish(&r)
		return r, err
	})
}

// Stats are counts over the ledger's records.
type Stats struct {
	// ByState counts records by state and operation: ByState[state][operation].
	ByState map[State]map[string]int64
	// OldestPending is when the oldest pending record was created; zero when none is.
	OldestPending time.Time
	// Stuck counts pending records whose lease ran out.
	Stuck int64
	// Expired counts records past their retention, awaiting [Ledger.Purge].
	Expired int64
}

// Stats counts the ledger's records.
func (l *Ledger) Stats(ctx context.Context) (Stats, error) {
	s := Stats{ByState: map[State]map[string]int64{}}
	rows, err := l.pool.Query(ctx, l.q.stats, l.now())
	if err != nil {
		return s, fmt.Errorf("oncekit/ledger: stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state, op string
		var n, stuck, expired int64
		var oldest *time.Time
		if err := rows.Scan(&state, &op, &n, &oldest, &stuck, &expired); err != nil {
			return s, err
		}
		if s.ByState[State(state)] == nil {
			s.ByState[State(state)] = map[string]int64{}
		}
		s.ByState[State(state)][op] = n
		if oldest != nil && (s.OldestPending.IsZero() || oldest.Before(s.OldestPending)) {
			s.OldestPending = *oldest
		}
		s.Stuck += stuck
		s.Expired += expired
	}
	return s, rows.Err()
}

// ForceRelease deletes the pending record of key in scope, whoever owns it, so that the
// next attempt starts afresh: for a key stuck in progress whose owner is known to be
// gone. A call that may have reached a provider is then made again under a new claim;
// the provider deduplicates it only by the same downstream key, which the key keeps.
// It reports whether a pending record was deleted.
func (l *Ledger) ForceRelease(ctx context.Context, scope keys.Scope, key keys.Key) (bool, error) {
	return l.operate(ctx, l.q.forceRelease, scope, key)
}

// Evict deletes the completed or failed record of key in scope, so that the next request
// with the key runs again instead of replaying: for a stored result known to be wrong. It
// reports whether a record was deleted.
func (l *Ledger) Evict(ctx context.Context, scope keys.Scope, key keys.Key) (bool, error) {
	return l.operate(ctx, l.q.evict, scope, key)
}

func (l *Ledger) operate(ctx context.Context, sql string, scope keys.Scope, key keys.Key) (bool, error) {
	if err := scope.Validate(); err != nil {
		return false, err
	}
	if err := key.ValidateLen(l.cfg.MaxKeyLen); err != nil {
		return false, err
	}
	tag, err := l.pool.Exec(ctx, sql, scope.Tenant, scope.Operation, string(key))
	if err != nil {
		return false, fmt.Errorf("oncekit/ledger: %s in %s: %w", quoteKey(key), scope, err)
	}
	return tag.RowsAffected() == 1, nil
}

package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/shard"
)

// Operator calls: what the oncekit command runs for an on-call engineer. They read and
// change records whatever their owner, so they are not for application code.

// ListLimitDefault is how many records [Ledger.List] returns when ListOpts.Limit is 0.
const ListLimitDefault = 100

// ListOpts filter [Ledger.List]. A nil *ListOpts lists the newest records. Filters
// combine: a record is listed when it passes every one that is set.
type ListOpts struct {
	// State keeps records in this state. Defaults to every state.
	State State
	// Operation keeps records of this operation. Defaults to every operation.
	Operation string
	// Tenant keeps records of this tenant. Defaults to every tenant.
	Tenant string
	// OlderThan keeps records created at least this long ago. Defaults to 0: any age.
	OlderThan time.Duration
	// CreatedAfter keeps records created at or after this time. Defaults to the zero
	// time: no lower bound.
	CreatedAfter time.Time
	// CreatedBefore keeps records created before this time. Defaults to the zero time:
	// no upper bound.
	CreatedBefore time.Time
	// Stuck keeps pending records whose lease ran out and that no attempt took over.
	// Defaults to false: every record.
	Stuck bool
	// KeyPrefix keeps records whose key starts with it, byte for byte. Defaults to "":
	// every key.
	KeyPrefix string
	// KeyPatterns keeps records whose key matches one of these SQL LIKE patterns ('%'
	// for any run of bytes, '_' for one, '\' escaping either), for keys composed of parts
	// such as a workflow's run ID and an activity ID. Defaults to none: every key.
	KeyPatterns []string
	// Origin keeps records whose origin ([Record.Origin]) has its WorkflowID, RunID and
	// ActivityType, each when set (WorkflowType is not looked at). With KeyPatterns too,
	// a record with no origin (written before the ledger's migration 004, or outside a
	// worker with oncekit's plugin) passes when its key matches one of them. Defaults to
	// the zero Origin: every record.
	Origin Origin
	// After continues a listing after this record, the last of the previous page: the
	// records come newest first, ordered by creation time and then by tenant,
	// operation and key, and After's CreatedAt, Scope and Key say where the page
	// starts. Defaults to nil: the first page.
	After *Record
	// Limit bounds the number of records; a negative one is refused. Defaults to
	// [ListLimitDefault].
	Limit int
}

// List returns records, newest first, filtered by opts. On a ledger of several shards
// it lists every shard; when some fail, it returns the records of those that answered
// together with an error naming each that did not (a [*shard.Error] per shard).
func (l *Ledger) List(ctx context.Context, opts *ListOpts) ([]Record, error) {
	o := ListOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Limit < 0 || o.OlderThan < 0 {
		return nil, errors.New("oncekit/ledger: ListOpts.Limit and OlderThan must not be negative")
	}
	if o.Limit == 0 {
		o.Limit = ListLimitDefault
	}
	patterns := o.KeyPatterns
	if patterns == nil {
		patterns = []string{}
	}
	var after *time.Time
	var afterTenant, afterOp, afterKey string
	if o.After != nil {
		after = &o.After.CreatedAt
		afterTenant, afterOp, afterKey = o.After.Scope.Tenant, o.After.Scope.Operation, string(o.After.Key)
	}
	args := []any{string(o.State), o.Operation, o.Tenant, o.OlderThan.Seconds(), o.Stuck, o.Limit, l.now(),
		o.KeyPrefix, patterns, optionalTime(o.CreatedAfter), optionalTime(o.CreatedBefore), after, afterTenant, afterOp, afterKey,
		o.Origin.WorkflowID, o.Origin.RunID, o.Origin.ActivityType}
	if o.Tenant != "" {
		pool, err := l.r.Pool(o.Tenant)
		if err != nil {
			return nil, err
		}
		return l.listOn(ctx, pool, args)
	}
	var recs []Record
	err := l.r.Each(func(s shard.Shard) error {
		page, err := l.listOn(ctx, s.Pool, args)
		recs = append(recs, page...)
		return err
	})
	// Each shard's page is in order; merged, the newest o.Limit of them are the page:
	// the records of the shards that answered, beside an error naming those that did not.
	slices.SortStableFunc(recs, newestFirst)
	return recs[:min(len(recs), o.Limit)], err
}

func (l *Ledger) listOn(ctx context.Context, pool *pgxpool.Pool, args []any) ([]Record, error) {
	rows, err := pool.Query(ctx, l.q.list, args...)
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: list: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		var sc recordScan
		var key string
		var origin [4]*string
		err := row.Scan(append(append([]any{&r.Scope.Tenant, &r.Scope.Operation, &key}, sc.dest(&r)...),
			&origin[0], &origin[1], &origin[2], &origin[3])...)
		r.Key = keys.Key(key)
		sc.finish(&r)
		r.Origin = Origin{WorkflowID: deref(origin[0]), RunID: deref(origin[1]), WorkflowType: deref(origin[2]), ActivityType: deref(origin[3])}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: list: %w", err)
	}
	return recs, nil
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Stats are counts over the ledger's records.
type Stats struct {
	// ByState counts records by state and operation: ByState[state][operation].
	ByState map[State]map[string]int64
	// OldestPending is when the oldest pending record was created; zero when none is.
	OldestPending time.Time
	// Stuck counts pending records whose lease ran out.
	Stuck int64
	// Expired counts records past their retention, which count as absent.
	Expired int64
	// Purgeable counts the expired records [Ledger.Purge] deletes: all but pending
	// records whose lease is live.
	Purgeable int64
}

// Stats counts the ledger's records.
func (l *Ledger) Stats(ctx context.Context) (Stats, error) {
	s := Stats{ByState: map[State]map[string]int64{}}
	err := l.r.Each(func(sh shard.Shard) error { return l.statsOn(ctx, sh.Pool, &s) })
	return s, err
}

// statsOn adds the counts of the records on pool to s.
func (l *Ledger) statsOn(ctx context.Context, pool *pgxpool.Pool, s *Stats) error {
	rows, err := pool.Query(ctx, l.q.stats, l.now())
	if err != nil {
		return fmt.Errorf("oncekit/ledger: stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state, op string
		var n, stuck, expired, purgeable int64
		var oldest *time.Time
		if err := rows.Scan(&state, &op, &n, &oldest, &stuck, &expired, &purgeable); err != nil {
			return fmt.Errorf("oncekit/ledger: stats: %w", err)
		}
		if s.ByState[State(state)] == nil {
			s.ByState[State(state)] = map[string]int64{}
		}
		s.ByState[State(state)][op] += n
		if oldest != nil && (s.OldestPending.IsZero() || oldest.Before(s.OldestPending)) {
			s.OldestPending = *oldest
		}
		s.Stuck += stuck
		s.Expired += expired
		s.Purgeable += purgeable
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("oncekit/ledger: stats: %w", err)
	}
	return nil
}

// Action is an operator's change to a record, kept in its audit row.
type Action string

// The actions of [Ledger.Change].
const (
	// ActionRelease deletes a pending record, so that the next attempt claims the key
	// afresh and makes its external call again, with the same downstream key.
	ActionRelease Action = "release"
	// ActionEvict deletes a completed or failed record, so that the next request with
	// the key runs again instead of replaying.
	ActionEvict Action = "evict"
)

// Limits of [ChangeOpts].
const (
	// MaxActorLen is the longest ChangeOpts.Actor, in bytes.
	MaxActorLen = 256
	// MaxReasonLen is the longest ChangeOpts.Reason, in bytes.
	MaxReasonLen = 1024
)

// ChangeOpts describe an operator's change for [Ledger.Change]. Actor and Reason are
// required: they are what the audit row says of who and why.
type ChangeOpts struct {
	// Actor names who makes the change, such as "alice@host": text of at most
	// [MaxActorLen] bytes. Required; the audit row also keeps the database role.
	Actor string
	// Reason says why, such as the incident's reference: text of at most
	// [MaxReasonLen] bytes. Required.
	Reason string
	// Force releases a pending record whose lease is live: its attempt may still be
	// running and may yet make its external call. Defaults to false: such a record is
	// refused with a [*LeaseLiveError].
	Force bool
	// Expect, when set, makes the change only if the record still is as Expect shows it
	// (its state, owner token, lease, attempts and update time): the record the
	// operator looked at. Defaults to nil: whatever the record holds now.
	Expect *Record
}

// Sentinel conditions of [Ledger.Change]; the typed errors match them with [errors.Is].
var (
	// ErrLeaseLive: a pending record's lease is live, and the change was not forced.
	ErrLeaseLive = errors.New("oncekit/ledger: the record's lease is live")
	// ErrRecordChanged: the record is no longer as ChangeOpts.Expect shows it.
	ErrRecordChanged = errors.New("oncekit/ledger: the record changed since it was read")
	// ErrWrongState: the action does not apply to the record's state.
	ErrWrongState = errors.New("oncekit/ledger: the action does not apply to the record's state")
	// ErrNoReason: ChangeOpts lacks its Actor or Reason, or one of them is not text
	// within its limit.
	ErrNoReason = errors.New("oncekit/ledger: a change needs ChangeOpts.Actor and ChangeOpts.Reason, kept in its audit row")
)

// LeaseLiveError reports a release refused because the record's lease is live: the
// attempt that owns it may still be running.
type LeaseLiveError struct {
	Scope      keys.Scope
	Key        keys.Key
	Owner      string
	LeaseUntil time.Time
}

func (e *LeaseLiveError) Error() string {
	return fmt.Sprintf("oncekit/ledger: the pending record of key %s in %s has a live lease (owner %s, until %s): its attempt may still be running and make its call; release it by force only when that owner is known to be gone",
		quoteKey(e.Key), e.Scope, e.Owner, e.LeaseUntil.UTC().Format(time.RFC3339))
}

// Is matches [ErrLeaseLive].
func (e *LeaseLiveError) Is(target error) bool { return target == ErrLeaseLive }

// RecordChangedError reports a change refused because the record is no longer the one
// the operator saw. Current is the record as it is now.
type RecordChangedError struct {
	Scope   keys.Scope
	Key     keys.Key
	Current Record
}

func (e *RecordChangedError) Error() string {
	return fmt.Sprintf("oncekit/ledger: the record of key %s in %s changed since it was read (now %s, updated %s): look at it again before changing it",
		quoteKey(e.Key), e.Scope, e.Current.State, e.Current.UpdatedAt.UTC().Format(time.RFC3339Nano))
}

// Is matches [ErrRecordChanged].
func (e *RecordChangedError) Is(target error) bool { return target == ErrRecordChanged }

// WrongStateError reports an action that does not apply to the record's state: a
// release of a record that is not pending, or an eviction of one that is.
type WrongStateError struct {
	Scope  keys.Scope
	Key    keys.Key
	Action Action
	State  State
}

func (e *WrongStateError) Error() string {
	hint := "evict it instead"
	if e.Action == ActionEvict {
		hint = "a pending record is released, not evicted"
	}
	return fmt.Sprintf("oncekit/ledger: the record of key %s in %s is %s: %s", quoteKey(e.Key), e.Scope, e.State, hint)
}

// Is matches [ErrWrongState].
func (e *WrongStateError) Is(target error) bool { return target == ErrWrongState }

// AuditEntry is an operator's change to a record, as its audit row keeps it.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Scope  keys.Scope
	Key    keys.Key
	Action Action
	// Actor is ChangeOpts.Actor; DBUser the database role the change was made as.
	Actor  string
	DBUser string
	Reason string
	// Forced is set when a pending record's live lease was released by force.
	Forced bool
	// Before is the record as it was, without its body: Before.Response.Body is nil,
	// and BodyBytes and BodySHA256 describe the body it had.
	Before     Record
	BodyBytes  int
	BodySHA256 string
}

// Change releases or evicts the record of key in scope for an operator, and keeps an
// audit row of it (who, when, why and the record as it was) in the same transaction;
// [Ledger.Audit] reads the rows back. A release applies to a pending record, and is
// refused with a [*LeaseLiveError] while the lease is live unless opts.Force is set; an
// eviction applies to a completed or failed record. A missing record is [ErrNotFound],
// another state a [*WrongStateError], and a record that is no longer opts.Expect a
// [*RecordChangedError]; nothing is changed then.
func (l *Ledger) Change(ctx context.Context, action Action, scope keys.Scope, key keys.Key, opts *ChangeOpts) (AuditEntry, error) {
	var o ChangeOpts
	if opts != nil {
		o = *opts
	}
	if err := scope.Validate(); err != nil {
		return AuditEntry{}, err
	}
	if err := key.ValidateLen(l.cfg.MaxKeyLen); err != nil {
		return AuditEntry{}, err
	}
	if action != ActionRelease && action != ActionEvict {
		return AuditEntry{}, fmt.Errorf("oncekit/ledger: unknown action %q: use ActionRelease or ActionEvict", action)
	}
	if !auditText(o.Actor, MaxActorLen) || !auditText(o.Reason, MaxReasonLen) {
		return AuditEntry{}, fmt.Errorf("%w: each must be valid UTF-8 without NUL, 1 to %d and %d bytes", ErrNoReason, MaxActorLen, MaxReasonLen)
	}
	pool, err := l.r.Pool(scope.Tenant)
	if err != nil {
		return AuditEntry{}, err
	}
	var entry AuditEntry
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r := &Record{Scope: scope, Key: key}
		var sc recordScan
		err := tx.QueryRow(ctx, l.q.changeLock, scope.Tenant, scope.Operation, string(key), l.now()).Scan(sc.dest(r)...)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		sc.finish(r)
		if (r.State == StatePending) != (action == ActionRelease) {
			return &WrongStateError{Scope: scope, Key: key, Action: action, State: r.State}
		}
		if e := o.Expect; e != nil && (e.State != r.State || e.OwnerToken != r.OwnerToken || !e.LeaseUntil.Equal(r.LeaseUntil) ||
			e.Attempts != r.Attempts || !e.UpdatedAt.Equal(r.UpdatedAt)) {
			return &RecordChangedError{Scope: scope, Key: key, Current: *r}
		}
		forced := action == ActionRelease && !r.LeaseExpired
		if forced && !o.Force {
			return &LeaseLiveError{Scope: scope, Key: key, Owner: r.OwnerToken.String(), LeaseUntil: r.LeaseUntil}
		}
		var before []byte
		entry = AuditEntry{Scope: scope, Key: key, Action: action, Actor: o.Actor, Reason: o.Reason, Forced: forced}
		if err := tx.QueryRow(ctx, l.q.changeDelete, scope.Tenant, scope.Operation, string(key), string(action), o.Actor, o.Reason, forced).
			Scan(&entry.ID, &entry.At, &entry.DBUser, &before); err != nil {
			return err
		}
		return entry.decodeBefore(before)
	})
	if err != nil {
		var (
			live    *LeaseLiveError
			changed *RecordChangedError
			wrong   *WrongStateError
		)
		if errors.Is(err, ErrNotFound) || errors.As(err, &live) || errors.As(err, &changed) || errors.As(err, &wrong) {
			return AuditEntry{}, err
		}
		return AuditEntry{}, fmt.Errorf("oncekit/ledger: %s %s in %s: %w", action, quoteKey(key), scope, err)
	}
	return entry, nil
}

// Audit returns the audit rows of key in scope, oldest first: every change
// [Ledger.Change] made to its records, including records that are gone.
func (l *Ledger) Audit(ctx context.Context, scope keys.Scope, key keys.Key) ([]AuditEntry, error) {
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	if err := key.ValidateLen(l.cfg.MaxKeyLen); err != nil {
		return nil, err
	}
	pool, err := l.r.Pool(scope.Tenant)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, l.q.audit, scope.Tenant, scope.Operation, string(key))
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: audit of %s in %s: %w", quoteKey(key), scope, err)
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		e := AuditEntry{Scope: scope, Key: key}
		var action string
		var before []byte
		if err := row.Scan(&e.ID, &e.At, &action, &e.Actor, &e.DBUser, &e.Reason, &e.Forced, &before); err != nil {
			return e, err
		}
		e.Action = Action(action)
		return e, e.decodeBefore(before)
	})
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: audit of %s in %s: %w", quoteKey(key), scope, err)
	}
	return entries, nil
}

// AuditOpts filter [Ledger.ListAudit]. A nil *AuditOpts lists the newest audit rows.
// Filters combine.
type AuditOpts struct {
	// Tenant, Operation and Key keep the rows of this tenant, operation and key.
	// Defaults to "": any.
	Tenant, Operation string
	Key               keys.Key
	// Actor keeps the rows of changes made by this actor (ChangeOpts.Actor). Defaults
	// to "": any.
	Actor string
	// Action keeps the rows of this action. Defaults to "": both.
	Action Action
	// Since and Until keep the rows of changes made at or after Since and before
	// Until. Defaults to zero: no bound.
	Since, Until time.Time
	// Limit bounds the number of rows; a negative one is refused. Defaults to
	// [ListLimitDefault].
	Limit int
}

// ListAudit returns audit rows of every key, newest first, filtered by opts: what
// operators released and evicted, by whom and why, including records that are gone.
func (l *Ledger) ListAudit(ctx context.Context, opts *AuditOpts) ([]AuditEntry, error) {
	o := AuditOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Limit < 0 {
		return nil, errors.New("oncekit/ledger: AuditOpts.Limit must not be negative")
	}
	if o.Limit == 0 {
		o.Limit = ListLimitDefault
	}
	if o.Action != "" && o.Action != ActionRelease && o.Action != ActionEvict {
		return nil, fmt.Errorf("oncekit/ledger: unknown action %q: use ActionRelease or ActionEvict", o.Action)
	}
	args := []any{o.Tenant, o.Operation, string(o.Key), o.Actor, string(o.Action), optionalTime(o.Since), optionalTime(o.Until), o.Limit}
	var entries []AuditEntry
	each := func(pool *pgxpool.Pool) error {
		rows, err := pool.Query(ctx, l.q.auditList, args...)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
			var e AuditEntry
			var action, key string
			var before []byte
			if err := row.Scan(&e.ID, &e.At, &e.Scope.Tenant, &e.Scope.Operation, &key, &action, &e.Actor, &e.DBUser, &e.Reason,
				&e.Forced, &before); err != nil {
				return e, err
			}
			e.Key, e.Action = keys.Key(key), Action(action)
			return e, e.decodeBefore(before)
		})
		entries = append(entries, got...)
		return err
	}
	var err error
	if o.Tenant != "" {
		var pool *pgxpool.Pool
		if pool, err = l.r.Pool(o.Tenant); err == nil {
			err = each(pool)
		}
	} else {
		err = l.r.Each(func(s shard.Shard) error { return each(s.Pool) })
		// Each shard's rows are in order; merged, the newest o.Limit of them.
		slices.SortStableFunc(entries, func(a, b AuditEntry) int {
			if c := b.At.Compare(a.At); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
		entries = entries[:min(len(entries), o.Limit)]
	}
	if err != nil {
		return nil, fmt.Errorf("oncekit/ledger: list audit rows: %w", err)
	}
	if entries == nil {
		entries = []AuditEntry{}
	}
	return entries, nil
}

// auditedRecord is the before column of an audit row: the record's columns, less the
// body, plus the body's size and digest.
type auditedRecord struct {
	Fingerprint  string     `json:"fingerprint"`
	State        string     `json:"state"`
	StatusCode   int        `json:"status_code"`
	ErrorCode    *string    `json:"error_code"`
	ErrorMessage *string    `json:"error_message"`
	ResourceRef  *string    `json:"resource_ref"`
	OwnerToken   *string    `json:"owner_token"`
	LeaseUntil   *time.Time `json:"lease_until"`
	Uncertain    bool       `json:"uncertain"`
	Attempts     int        `json:"attempts"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	ExpiresAt    time.Time  `json:"expires_at"`
	BodyBytes    int        `json:"body_bytes"`
	BodySHA256   string     `json:"body_sha256"`
}

func (e *AuditEntry) decodeBefore(b []byte) error {
	var a auditedRecord
	if err := json.Unmarshal(b, &a); err != nil {
		return fmt.Errorf("oncekit/ledger: read an audit row's record: %w", err)
	}
	r := Record{Scope: e.Scope, Key: e.Key, Fingerprint: keys.Fingerprint(a.Fingerprint), State: State(a.State),
		Response:  Response{Code: a.StatusCode, ResourceRef: deref(a.ResourceRef)},
		ErrorCode: deref(a.ErrorCode), ErrorMessage: deref(a.ErrorMessage), Uncertain: a.Uncertain, Attempts: a.Attempts,
		CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt, ExpiresAt: a.ExpiresAt}
	if a.OwnerToken != nil {
		if err := r.OwnerToken.UnmarshalText([]byte(*a.OwnerToken)); err != nil {
			return fmt.Errorf("oncekit/ledger: read an audit row's owner token: %w", err)
		}
	}
	if a.LeaseUntil != nil {
		r.LeaseUntil = *a.LeaseUntil
	}
	e.Before, e.BodyBytes, e.BodySHA256 = r, a.BodyBytes, a.BodySHA256
	return nil
}

// auditText reports whether s is text an audit row can keep: 1 to max bytes of valid
// UTF-8 without NUL.
func auditText(s string, max int) bool {
	return s != "" && len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// pendingCounts counts pending records whose lease is live and those whose lease ran
// out, for the oncekit.ledger.pending gauge.
func (l *Ledger) pendingCounts(ctx context.Context) (live, expired int64, err error) {
	err = l.r.Each(func(s shard.Shard) error {
		var lv, ex int64
		err := s.Pool.QueryRow(ctx, l.q.pending, l.now()).Scan(&lv, &ex)
		live, expired = live+lv, expired+ex
		return err
	})
	return live, expired, err
}

package ledger_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

var operator = &ledger.ChangeOpts{Actor: "alice@host", Reason: "INC-42: the worker is gone"}

// An operator's release refuses a live lease unless forced, applies to pending records
// only, and leaves an audit row with who, why and the record as it was.
func TestChange_Release(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("LiveLeaseNeedsForce", func(t *testing.T) {
		t.Parallel()
		l, _ := setup(t, nil)
		in := intent(t, "acme", "charge-1", order{Item: "lamp", Amount: 1})
		claim, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour})
		require.NoError(t, err)
		_, err = l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, operator)
		var live *ledger.LeaseLiveError
		require.ErrorAs(t, err, &live)
		require.ErrorIs(t, err, ledger.ErrLeaseLive)
		require.Equal(t, claim.Lease.Token.String(), live.Owner)
		rec, err := l.Get(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		require.Equal(t, ledger.StatePending, rec.State, "nothing changed")

		forced := *operator
		forced.Force = true
		entry, err := l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, &forced)
		require.NoError(t, err)
		require.True(t, entry.Forced)
		_, err = l.Get(ctx, in.Scope, in.Key)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		_, err = l.Complete(ctx, claim.Lease, ledger.Response{Body: []byte(`late`)})
		require.ErrorIs(t, err, ledger.ErrLeaseLost, "the released owner cannot complete")
	})

	t.Run("StuckLeaseAndAudit", func(t *testing.T) {
		t.Parallel()
		l, b := setup(t, nil)
		in := intent(t, "acme", "charge-2", order{Item: "lamp", Amount: 1})
		claim, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		b.clock.Advance(2 * time.Minute)
		entry, err := l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, operator)
		require.NoError(t, err)
		require.False(t, entry.Forced)
		require.Equal(t, ledger.ActionRelease, entry.Action)
		require.Equal(t, "alice@host", entry.Actor)
		require.NotEmpty(t, entry.DBUser)
		require.Equal(t, ledger.StatePending, entry.Before.State)
		require.Equal(t, claim.Lease.Token, entry.Before.OwnerToken)
		require.False(t, entry.Before.LeaseUntil.IsZero())

		audit, err := l.Audit(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		require.Len(t, audit, 1)
		require.Equal(t, entry.ID, audit[0].ID)
		require.Equal(t, operator.Reason, audit[0].Reason)
		require.Equal(t, claim.Lease.Token, audit[0].Before.OwnerToken)
	})

	t.Run("WrongStateAndMissing", func(t *testing.T) {
		t.Parallel()
		l, _ := setup(t, nil)
		in := intent(t, "acme", "order-1", order{Item: "lamp", Amount: 1})
		_, err := l.Do(ctx, in, createOrder("acme", order{Item: "lamp", Amount: 1}), nil)
		require.NoError(t, err)
		_, err = l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, operator)
		var wrong *ledger.WrongStateError
		require.ErrorAs(t, err, &wrong)
		require.ErrorIs(t, err, ledger.ErrWrongState)
		require.Contains(t, err.Error(), "evict it instead")
		_, err = l.Change(ctx, ledger.ActionEvict, in.Scope, "absent", operator)
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("NeedsActorAndReason", func(t *testing.T) {
		t.Parallel()
		l, _ := setup(t, nil)
		in := intent(t, "acme", "order-2", order{Item: "lamp", Amount: 1})
		for _, o := range []*ledger.ChangeOpts{nil, {Actor: "a"}, {Reason: "r"}, {Actor: "a", Reason: "bad\x00"},
			{Actor: strings.Repeat("a", ledger.MaxActorLen+1), Reason: "r"}, {Actor: "a", Reason: strings.Repeat("r", ledger.MaxReasonLen+1)}} {
			_, err := l.Change(ctx, ledger.ActionEvict, in.Scope, in.Key, o)
			require.ErrorIs(t, err, ledger.ErrNoReason)
		}
	})
}

// An eviction keeps the body's size and digest in its audit row, not the body.
func TestChange_EvictKeepsNoBody(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "order-3", order{Item: "lamp", Amount: 1})
	res, err := l.Do(ctx, in, createOrder("acme", order{Item: "lamp", Amount: 1}), nil)
	require.NoError(t, err)
	entry, err := l.Change(ctx, ledger.ActionEvict, in.Scope, in.Key, operator)
	require.NoError(t, err)
	sum := sha256.Sum256(res.Body)
	require.Equal(t, hex.EncodeToString(sum[:]), entry.BodySHA256)
	require.Equal(t, len(res.Body), entry.BodyBytes)
	require.Nil(t, entry.Before.Response.Body)
	require.Equal(t, res.ResourceRef, entry.Before.Response.ResourceRef)
	again, err := l.Do(ctx, in, createOrder("acme", order{Item: "lamp", Amount: 1}), nil)
	require.NoError(t, err)
	require.False(t, again.Replayed, "an evicted key runs again")
}

// A change made on what an operator saw is refused when the record moved on meanwhile:
// here the owner renewed its lease, and then another attempt took it over.
func TestChange_ExpectRefusesAChangedRecord(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "charge-3", order{Item: "lamp", Amount: 1})
	_, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	seen, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	second, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	o := *operator
	o.Expect = seen
	_, err = l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, &o)
	var changed *ledger.RecordChangedError
	require.ErrorAs(t, err, &changed)
	require.ErrorIs(t, err, ledger.ErrRecordChanged)
	require.Equal(t, second.Lease.Token, changed.Current.OwnerToken)
	audit, err := l.Audit(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Empty(t, audit)
}

// Many operators releasing the same stuck record: one release happens, one audit row.
func TestChange_ConcurrentReleasesAuditOnce(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	in := intent(t, "acme", "charge-4", order{Item: "lamp", Amount: 1})
	_, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Minute})
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done, missing := 0, 0
	for range 16 {
		wg.Go(func() {
			_, err := l.Change(ctx, ledger.ActionRelease, in.Scope, in.Key, operator)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				done++
			case errors.Is(err, ledger.ErrNotFound):
				missing++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1, done)
	require.Equal(t, 15, missing)
	audit, err := l.Audit(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Len(t, audit, 1)
}

// List finds records by key prefix, LIKE patterns and creation time, and pages through
// them newest first without skipping or repeating one.
func TestList_FiltersAndPages(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	start := b.clock.Now()
	for i := range 7 {
		key := keys.Run(fmt.Sprintf("run-%d", i%2), fmt.Sprintf("%d", i))
		in := intent(t, "acme", string(key), order{Item: "x", Amount: int64(i)})
		_, err := l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{}, nil }, nil)
		require.NoError(t, err)
		b.clock.Advance(time.Second)
	}
	recs, err := l.List(ctx, &ledger.ListOpts{KeyPrefix: string(keys.Run("run-1", "x"))[:len("v1:run:run-1:")]})
	require.NoError(t, err)
	require.Len(t, recs, 3)
	recs, err = l.List(ctx, &ledger.ListOpts{KeyPatterns: []string{`v1:run:%:3`, `v1:run:%:4`}})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	recs, err = l.List(ctx, &ledger.ListOpts{CreatedAfter: start.Add(2 * time.Second), CreatedBefore: start.Add(4 * time.Second)})
	require.NoError(t, err)
	require.Len(t, recs, 2)

	var seen []string
	var after *ledger.Record
	for {
		page, err := l.List(ctx, &ledger.ListOpts{Tenant: "acme", Limit: 3, After: after})
		require.NoError(t, err)
		for _, r := range page {
			seen = append(seen, string(r.Key))
		}
		if len(page) < 3 {
			break
		}
		after = &page[len(page)-1]
	}
	require.Len(t, seen, 7)
	require.Equal(t, string(keys.Run("run-0", "6")), seen[0], "newest first")
	_, err = l.List(ctx, &ledger.ListOpts{Limit: -1})
	require.Error(t, err)
}

// ListAudit lists every key's audit rows newest first, filtered by tenant, operation,
// key, actor, action and time, and bounded by its limit.
func TestListAudit_FiltersNewestFirst(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	ctx := context.Background()
	change := func(tenant, key string, action ledger.Action, actor string) ledger.AuditEntry {
		in := intent(t, tenant, key, order{Item: "lamp", Amount: 1})
		if action == ledger.ActionEvict {
			_, err := l.Do(ctx, in, createOrder(tenant, order{Item: "lamp", Amount: 1}), nil)
			require.NoError(t, err)
		} else {
			_, err := l.Claim(ctx, in, &ledger.ClaimOpts{Lease: time.Hour})
			require.NoError(t, err)
		}
		e, err := l.Change(ctx, action, in.Scope, in.Key, &ledger.ChangeOpts{Actor: actor, Reason: "INC-1", Force: true})
		require.NoError(t, err)
		return e
	}
	a := change("acme", "k-1", ledger.ActionEvict, "alice")
	b := change("acme", "k-2", ledger.ActionRelease, "bob")
	c := change("globex", "k-1", ledger.ActionEvict, "alice")
	ids := func(opts *ledger.AuditOpts) []int64 {
		entries, err := l.ListAudit(ctx, opts)
		require.NoError(t, err)
		out := []int64{}
		for _, e := range entries {
			out = append(out, e.ID)
		}
		return out
	}
	require.Equal(t, []int64{c.ID, b.ID, a.ID}, ids(nil))
	require.Equal(t, []int64{b.ID, a.ID}, ids(&ledger.AuditOpts{Tenant: "acme"}))
	require.Equal(t, []int64{c.ID, a.ID}, ids(&ledger.AuditOpts{Key: "k-1"}))
	require.Equal(t, []int64{c.ID, a.ID}, ids(&ledger.AuditOpts{Actor: "alice"}))
	require.Equal(t, []int64{b.ID}, ids(&ledger.AuditOpts{Action: ledger.ActionRelease}))
	require.Equal(t, []int64{c.ID}, ids(&ledger.AuditOpts{Limit: 1}))
	require.Equal(t, []int64{}, ids(&ledger.AuditOpts{Since: c.At.Add(time.Second)}))
	require.Equal(t, []int64{c.ID, b.ID, a.ID}, ids(&ledger.AuditOpts{Since: a.At, Until: c.At.Add(time.Second)}))
	entries, err := l.ListAudit(ctx, &ledger.AuditOpts{Tenant: "acme", Key: "k-2"})
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, keys.Scope{Tenant: "acme", Operation: "orders.create"}, entries[0].Scope)
	require.Equal(t, keys.Key("k-2"), entries[0].Key)
	require.Equal(t, ledger.StatePending, entries[0].Before.State)
	require.True(t, entries[0].Forced)
	_, err = l.ListAudit(ctx, &ledger.AuditOpts{Limit: -1})
	require.Error(t, err)
	_, err = l.ListAudit(ctx, &ledger.AuditOpts{Action: "purge"})
	require.Error(t, err)
}

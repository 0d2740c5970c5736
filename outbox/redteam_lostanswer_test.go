package outbox_test

// Tests of what a dispatcher reports when an answer from PostgreSQL is lost, through
// a TCP proxy that cuts the connection or drops the server's answers after a chosen
// round trip. The ledger's contract: once a commit is sent, an error other than
// ledger.ErrOutcomeUnknown means nothing committed.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

type rtPublications struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func (p *rtPublications) Publish(ctx context.Context, e outbox.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n[e.ID]++
	return nil
}

func (p *rtPublications) count(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id]
}

// rtOutbox is a migrated schema, an outbox on a direct pool (the truth) and a
// dispatcher whose pool goes through a fault proxy that, armed, cuts the connection or
// drops every answer after the chosen round trip that executes a statement.
func rtOutbox(t *testing.T) (*outbox.Outbox, *outbox.Dispatcher, *faultproxy.Proxy, *rtPublications, *pgxpool.Pool) {
	t.Helper()
	direct, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up), "")
	od, err := outbox.New(direct, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	px := faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{})
	op, err := outbox.New(pgtest.Pool(t, schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		px.Route(&c.ConnConfig.Config)
	}), &outbox.Config{Schema: schema})
	require.NoError(t, err)
	pubs := &rtPublications{n: map[uuid.UUID]int{}}
	d, err := outbox.NewDispatcher(op, pubs, &outbox.DispatcherConfig{PublishTimeout: 300 * time.Millisecond, Lease: time.Second})
	require.NoError(t, err)
	return od, d, px, pubs, direct
}

func rtEnqueue(t *testing.T, o *outbox.Outbox, db *pgxpool.Pool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	ids, err := o.Enqueue(ctx, tx, outbox.Event{Topic: "t", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return ids[0]
}

// TestRedteamDispatchOnceClaimAnswerLost cuts the connection right after the
// dispatcher sends the statement that claims its batch, a statement that commits by
// itself. The claim commits (the event is locked for the lease), yet DispatchOnce
// returns a plain error, which by the ledger's contract says nothing committed; it
// should match ledger.ErrOutcomeUnknown.
func TestRedteamDispatchOnceClaimAnswerLost(t *testing.T) {
	od, d, px, _, direct := rtOutbox(t)
	ctx := context.Background()
	for _, act := range []faultproxy.Action{faultproxy.CutAfter, faultproxy.Blackhole} {
		n := 1 // the claim
		id := rtEnqueue(t, od, direct)
		px.Arm(act, n, true)
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := d.DispatchOnce(cctx)
		cancel()
		fired, at := px.Disarm()
		require.True(t, fired, "action %d: the claim went through the proxy", act)
		px.Settle(t, direct)
		rec, gerr := od.Get(ctx, id)
		require.NoError(t, gerr)
		t.Logf("round trip %d (%.40q), action %d: %v; event %s, locked until %v", n, at, act, err, rec.State, rec.LockedUntil)
		if rec.State == outbox.StatePending && !rec.LockedUntil.IsZero() && !errors.Is(err, ledger.ErrOutcomeUnknown) {
			t.Errorf("answer to round trip %d, %.60q, lost (action %d): the claim committed (locked until %v), yet DispatchOnce returned %v", n, at, act, rec.LockedUntil, err)
		}
		// Let the lease run out before the next round, so it claims a fresh batch.
		require.Eventually(t, func() bool {
			r, err := od.Get(ctx, id)
			require.NoError(t, err)
			return r.LockedUntil.Before(time.Now())
		}, 10*time.Second, 10*time.Millisecond)
		_, err = d.Drain(ctx)
		require.NoError(t, err)
	}
}

// TestRedteamDispatchOnceRecordAnswerLost cuts the connection after each round trip of
// DispatchOnce past the claim: a lost answer to the record of outcomes is reported as
// ledger.ErrOutcomeUnknown and retried, and the event is published once.
func TestRedteamDispatchOnceRecordAnswerLost(t *testing.T) {
	od, d, px, pubs, direct := rtOutbox(t)
	ctx := context.Background()
	for n := 2; ; n++ { // past the claim
		id := rtEnqueue(t, od, direct)
		px.Arm(faultproxy.CutAfter, n, true)
		_, err := d.DispatchOnce(ctx)
		fired, at := px.Disarm()
		if !fired {
			require.NoError(t, err)
			require.Greater(t, n, 2, "the proxy cut none of DispatchOnce's round trips past the claim")
			break
		}
		px.Settle(t, direct)
		rec, gerr := od.Get(ctx, id)
		require.NoError(t, gerr)
		label := fmt.Sprintf("cut after round trip %d (%.60q)", n, at)
		if rec.State == outbox.StatePublished && err != nil {
			var lle *outbox.LeaseLostError
			require.True(t, errors.Is(err, ledger.ErrOutcomeUnknown) || errors.As(err, &lle), "%s: recorded, yet DispatchOnce returned %v", label, err)
		}
		require.Eventually(t, func() bool {
			_, err := d.Drain(ctx)
			require.NoError(t, err)
			r, err := od.Get(ctx, id)
			require.NoError(t, err)
			return r.State == outbox.StatePublished
		}, 15*time.Second, 20*time.Millisecond, label)
		require.Equal(t, 1, pubs.count(id), label)
	}
}

package ledger_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

var testOrigin = ledger.Origin{WorkflowID: "order-1", RunID: "run-a", WorkflowType: "OrderWorkflow", ActivityType: "Charge"}

// Every way of writing a record stores the origin its context carries, and a record
// written without one has none.
func TestOrigin_RecordedOnEveryWrite(t *testing.T) {
	t.Parallel()
	l, bb := setup(t, nil)
	ctx := ledger.WithOrigin(context.Background(), testOrigin)
	req := order{Item: "book", Amount: 1}
	check := func(t *testing.T, key string, want ledger.Origin) {
		t.Helper()
		rec, err := l.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: "orders.create"}, keys.Key(key))
		require.NoError(t, err)
		require.Equal(t, want, rec.Origin, key)
	}
	for _, m := range modes {
		key := "do-" + modeName(m)
		_, err := l.Do(ctx, intent(t, "acme", key, req), createOrder("acme", req), &ledger.DoOpts{Mode: m})
		require.NoError(t, err)
		check(t, key, testOrigin)

		key = "dotx-" + modeName(m)
		require.NoError(t, pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
			_, err := l.DoTx(ctx, tx, intent(t, "acme", key, req), createOrder("acme", req), &ledger.DoOpts{Mode: m})
			return err
		}))
		check(t, key, testOrigin)

		key = "failed-" + modeName(m)
		_, err = l.Do(ctx, intent(t, "acme", key, req), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{}, ledger.Definitive("declined", "card declined")
		}, &ledger.DoOpts{Mode: m})
		require.ErrorAs(t, err, new(*ledger.DefinitiveError))
		check(t, key, testOrigin)
	}

	claim, err := l.Claim(ctx, intent(t, "acme", "claim", req), nil)
	require.NoError(t, err)
	check(t, "claim", testOrigin)
	_, err = l.Complete(ctx, claim.Lease, ledger.Response{Body: []byte(`{}`)})
	require.NoError(t, err)
	check(t, "claim", testOrigin)

	if !pgtest.IsCitus() { // DoStatement does not run on Citus
		_, err = l.DoStatement(ctx, intent(t, "acme", "statement", req), insertOrderStmt("acme", req), nil)
		require.NoError(t, err)
		check(t, "statement", testOrigin)
	}

	_, err = l.Do(context.Background(), intent(t, "acme", "none", req), createOrder("acme", req), nil)
	require.NoError(t, err)
	check(t, "none", ledger.Origin{})
}

// A later attempt of the same intent (a claim whose lease ran out, taken over by another
// run) keeps the origin of the attempt that first wrote the record; an expired record
// taken as a new intent gets the new one's.
func TestOrigin_KeptByTheIntentsLaterAttempts(t *testing.T) {
	t.Parallel()
	l, bb := setup(t, &ledger.Config{Lease: time.Minute, Retention: time.Hour})
	req := order{Item: "book", Amount: 1}
	in := intent(t, "acme", "k", req)
	first := ledger.WithOrigin(context.Background(), testOrigin)
	_, err := l.Claim(first, in, nil)
	require.NoError(t, err)

	bb.clock.Advance(2 * time.Minute)
	other := testOrigin
	other.RunID = "run-b"
	res, err := l.Claim(ledger.WithOrigin(context.Background(), other), in, nil)
	require.NoError(t, err)
	require.True(t, res.Lease.Redrive)
	rec, err := l.Get(context.Background(), in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, testOrigin, rec.Origin)
	_, err = l.Complete(context.Background(), res.Lease, ledger.Response{})
	require.NoError(t, err)

	bb.clock.Advance(2 * time.Hour)
	_, err = l.Do(ledger.WithOrigin(context.Background(), other), in, createOrder("acme", req), nil)
	require.NoError(t, err)
	rec, err = l.Get(context.Background(), in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, other, rec.Origin)
}

// An origin too long for one index entry is cut at a character boundary, and text
// PostgreSQL cannot hold is repaired, so that the record is written anyway.
func TestOrigin_LongOrInvalidTextIsStored(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	long := strings.Repeat("é", ledger.MaxOriginLen) // 2 bytes a character
	o := ledger.Origin{WorkflowID: long, RunID: "run\x00a", ActivityType: "bad\xffutf8"}
	req := order{Item: "book", Amount: 1}
	in := intent(t, "acme", "k", req)
	_, err := l.Do(ledger.WithOrigin(context.Background(), o), in, createOrder("acme", req), nil)
	require.NoError(t, err)
	rec, err := l.Get(context.Background(), in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, long[:ledger.MaxOriginLen], rec.Origin.WorkflowID)
	require.Equal(t, "run\uFFFDa", rec.Origin.RunID)
	require.Equal(t, "bad\uFFFDutf8", rec.Origin.ActivityType)
}

// List finds records by their origin's columns and, with key patterns as well, records
// without an origin (written before migration 004) by their key.
func TestList_ByOriginFallingBackToTheKey(t *testing.T) {
	t.Parallel()
	l, bb := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "book", Amount: 1}
	write := func(key string, o *ledger.Origin) {
		c := ctx
		if o != nil {
			c = ledger.WithOrigin(ctx, *o)
		}
		_, err := l.Do(c, intent(t, "acme", key, req), createOrder("acme", req), nil)
		require.NoError(t, err)
		bb.clock.Advance(time.Second)
	}
	write(string(keys.Run("run-a", "1")), &testOrigin) // a default key: no workflow ID in it
	other := ledger.Origin{WorkflowID: "order-2", RunID: "run-c", ActivityType: "Ship"}
	write(string(keys.Run("run-c", "1")), &other)
	write(string(keys.Workflow("order-1", "9")), nil) // an old record: found by its key
	names := func(recs []ledger.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, string(r.Key))
		}
		return out
	}

	recs, err := l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "order-1"}})
	require.NoError(t, err)
	require.Equal(t, []string{string(keys.Run("run-a", "1"))}, names(recs))
	require.Equal(t, testOrigin, recs[0].Origin)

	recs, err = l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "order-1"}, KeyPatterns: []string{"v1:wf:order-1:%"}})
	require.NoError(t, err)
	require.Equal(t, []string{string(keys.Workflow("order-1", "9")), string(keys.Run("run-a", "1"))}, names(recs))

	recs, err = l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{ActivityType: "Ship"}})
	require.NoError(t, err)
	require.Equal(t, []string{string(keys.Run("run-c", "1"))}, names(recs))

	recs, err = l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "order-1", ActivityType: "Ship"}})
	require.NoError(t, err)
	require.Empty(t, recs)

	recs, err = l.List(ctx, &ledger.ListOpts{Origin: ledger.Origin{RunID: "run-c"}})
	require.NoError(t, err)
	require.Equal(t, []string{string(keys.Run("run-c", "1"))}, names(recs))
}

// Many concurrent writers with origins, under -race: every record carries its own.
func TestOrigin_ConcurrentWriters(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	req := order{Item: "book", Amount: 1}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := ledger.Origin{WorkflowID: "wf-" + itoa(int64(i)), RunID: "run-" + itoa(int64(i)), ActivityType: "Charge"}
			_, err := l.Do(ledger.WithOrigin(context.Background(), o), intent(t, "acme", "k-"+itoa(int64(i)), req),
				createOrder("acme", req), &ledger.DoOpts{Mode: modes[i%len(modes)]})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range 32 {
		recs, err := l.List(context.Background(), &ledger.ListOpts{Origin: ledger.Origin{WorkflowID: "wf-" + itoa(int64(i))}})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Equal(t, keys.Key("k-"+itoa(int64(i))), recs[0].Key)
		require.Equal(t, "run-"+itoa(int64(i)), recs[0].Origin.RunID)
	}
}

// OriginFrom returns what WithOrigin put in a context, and nothing for one without.
func TestOriginFrom(t *testing.T) {
	_, ok := ledger.OriginFrom(context.Background())
	require.False(t, ok)
	want := ledger.Origin{WorkflowID: "order-1", RunID: "run-1", WorkflowType: "Checkout", ActivityType: "payments.Charge"}
	got, ok := ledger.OriginFrom(ledger.WithOrigin(context.Background(), want))
	require.True(t, ok)
	require.Equal(t, want, got)
}

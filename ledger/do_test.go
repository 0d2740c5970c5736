package ledger_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// The server commits the mutation but the response never reaches the client: the
// client's retry gets the stored result, byte for byte, and the mutation ran once.
func TestDo_ResponseLostRetryReplays(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, b := setup(t, nil)
		ctx := context.Background()
		req := order{Item: "book", Amount: 1200}
		in := intent(t, "acme", "order-1", req)
		opts := &ledger.DoOpts{Mode: mode}

		res1, err := l.Do(ctx, in, createOrder("acme", req), opts)
		require.NoError(t, err)
		require.False(t, res1.Replayed)
		// The response is "lost": the client only knows to retry.
		res2, err := l.Do(ctx, in, createOrder("acme", req), opts)
		require.NoError(t, err)
		require.True(t, res2.Replayed)
		require.Equal(t, res1.Code, res2.Code)
		require.Equal(t, res1.Body, res2.Body) // byte-equal
		require.Equal(t, res1.ResourceRef, res2.ResourceRef)
		require.Equal(t, 1, countOrders(t, b.pool, "acme"))

		rec, err := l.Get(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		require.Equal(t, ledger.StateCompleted, rec.State)
		require.Equal(t, res1.Body, rec.Response.Body)
	})
}

// A replay is semantically equal to the first result even when the state it came from
// has changed since.
func TestDo_ReplayIsByteEqualAfterStateChanges(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "lamp", Amount: 4500}
	in := intent(t, "acme", "order-lamp", req)
	res1, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE orders SET item = 'changed'")
	require.NoError(t, err)
	for range 3 {
		res, err := l.Do(ctx, in, createOrder("acme", req), nil)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, res1.Body, res.Body)
	}
}

// 64 goroutines race on one key: the business table has exactly one row and every
// caller gets the same result.
func TestDo_RaceOnOneKey(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, b := setup(t, nil)
		ctx := context.Background()
		req := order{Item: "chair", Amount: 9900}
		in := intent(t, "acme", "order-race", req)
		const n = 64
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			bodies  = map[string]int{}
			replays int
			start   = make(chan struct{})
		)
		for range n {
			wg.Go(func() {
				<-start
				res, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
					resp, err := createOrder("acme", req)(ctx, tx)
					// Hold the claim a moment so the others pile up behind it.
					_, _ = tx.Exec(ctx, "SELECT pg_sleep(0.05)")
					return resp, err
				}, &ledger.DoOpts{Wait: 30 * time.Second, Mode: mode})
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				bodies[string(res.Body)]++
				if res.Replayed {
					replays++
				}
			})
		}
		close(start)
		wg.Wait()
		require.Len(t, bodies, 1, "every caller gets the same result")
		require.Equal(t, n-1, replays)
		require.Equal(t, 1, countOrders(t, b.pool, "acme"))
	})
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// The same key reused with a different payload is rejected and nothing runs. A mode
// that claims before fn never calls it; ModeClaimWithFirstStatement calls it, but its
// first statement does not run; ModeOptimistic runs it, but nothing it wrote takes
// effect.
func TestDo_SameKeyDifferentPayload(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, b := setup(t, nil)
		ctx := context.Background()
		first := order{Item: "desk", Amount: 100}
		_, err := l.Do(ctx, intent(t, "acme", "order-x", first), createOrder("acme", first), nil)
		require.NoError(t, err)

		second := order{Item: "desk", Amount: 999}
		ran := false
		var fnErr error
		in := intent(t, "acme", "order-x", second)
		_, err = l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			ran = true
			resp, err := createOrder("acme", second)(ctx, tx)
			fnErr = err
			return resp, err
		}, &ledger.DoOpts{Mode: mode})
		require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
		var mm *ledger.FingerprintMismatchError
		require.ErrorAs(t, err, &mm)
		require.Equal(t, in.Scope, mm.Scope)
		require.Equal(t, in.Key, mm.Key)
		require.Equal(t, intent(t, "acme", "order-x", first).Fingerprint, mm.StoredFingerprint)
		require.Equal(t, in.Fingerprint, mm.Fingerprint)
		require.Equal(t, ledger.StateCompleted, mm.StoredState)
		switch mode {
		case ledger.ModeClaimFirst, ledger.ModeLookUpFirst:
			require.False(t, ran, "fn is not called")
		case ledger.ModeClaimWithFirstStatement:
			require.True(t, ran)
			require.Error(t, fnErr, "fn's statement did not run")
		}
		require.Equal(t, 1, countOrders(t, b.pool, "acme"), "nothing fn wrote took effect")
	})
}

// A record expires and a genuine late retry arrives: the expired record counts as
// absent, so the retry is a new intent and runs again (with any payload).
func TestDo_ExpiredRecordLateRetryRunsAgain(t *testing.T) {
	t.Parallel()
	l, b := setup(t, &ledger.Config{OperationRetention: map[string]time.Duration{"orders.create": time.Hour}})
	ctx := context.Background()
	req := order{Item: "tea", Amount: 300}
	in := intent(t, "acme", "order-tea", req)
	res1, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)

	b.clock.Advance(59 * time.Minute)
	res, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed, "within retention the retry replays")

	b.clock.Advance(2 * time.Minute)
	rec, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.True(t, rec.Expired)

	late := order{Item: "tea", Amount: 350} // a late retry may even carry another payload
	res2, err := l.Do(ctx, intent(t, "acme", "order-tea", late), createOrder("acme", late), nil)
	require.NoError(t, err)
	require.False(t, res2.Replayed, "after expiry the retry is a new intent")
	require.NotEqual(t, res1.Body, res2.Body)
	require.Equal(t, 2, countOrders(t, b.pool, "acme"))
	require.Equal(t, 1, countRecords(t, b.pool, b.schema))
}

// A definitive failure is stored with the mutation's writes rolled back, and replayed.
func TestDo_DefinitiveFailureIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "gold", Amount: 1_000_000}
	in := intent(t, "acme", "order-gold", req)
	calls := 0 // fn's that got past their first statement
	fn := func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		if _, err := createOrder("acme", req)(ctx, tx); err != nil {
			return ledger.Response{}, err
		}
		calls++
		return ledger.Response{}, ledger.Definitive("limit_exceeded", "amount over the account limit")
	}
	_, err := l.Do(ctx, in, fn, nil)
	var derr *ledger.DefinitiveError
	require.ErrorAs(t, err, &derr)
	require.False(t, derr.Replayed)
	require.Equal(t, 0, countOrders(t, b.pool, "acme"), "the failed mutation's writes are rolled back")

	_, err = l.Do(ctx, in, fn, nil)
	require.ErrorAs(t, err, &derr)
	require.True(t, derr.Replayed)
	require.Equal(t, "limit_exceeded", derr.Code)
	require.Equal(t, "amount over the account limit", derr.Message)
	require.Equal(t, 1, calls)

	rec, err := l.Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, ledger.StateFailed, rec.State)
}

// Any other error rolls back everything and leaves the key free.
func TestDo_RetryableErrorLeavesKeyFree(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "pen", Amount: 5}
	in := intent(t, "acme", "order-pen", req)
	boom := errors.New("downstream timeout")
	_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		if _, err := createOrder("acme", req)(ctx, tx); err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{}, boom
	}, nil)
	require.ErrorIs(t, err, boom)
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
	_, err = l.Get(ctx, in.Scope, in.Key)
	require.ErrorIs(t, err, ledger.ErrNotFound)

	res, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// The same key under two tenants is two independent records; neither sees the other's.
func TestDo_TenantsAreIsolated(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	a, bReq := order{Item: "a", Amount: 1}, order{Item: "b", Amount: 2}
	resA, err := l.Do(ctx, intent(t, "tenant-a", "same-key", a), createOrder("tenant-a", a), nil)
	require.NoError(t, err)
	resB, err := l.Do(ctx, intent(t, "tenant-b", "same-key", bReq), createOrder("tenant-b", bReq), nil)
	require.NoError(t, err)
	require.False(t, resB.Replayed, "tenant b's first use of the key runs")
	require.NotEqual(t, resA.Body, resB.Body)

	// Tenant b replaying with tenant a's payload does not get a's result.
	_, err = l.Do(ctx, intent(t, "tenant-b", "same-key", a), createOrder("tenant-b", a), nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
	require.Equal(t, 1, countOrders(t, b.pool, "tenant-a"))
	require.Equal(t, 1, countOrders(t, b.pool, "tenant-b"))
}

// A concurrent duplicate fails fast with a retryable error by default, or waits and
// replays when asked to.
func TestDo_ConcurrentDuplicate(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "sofa", Amount: 70000}
	in := intent(t, "acme", "order-sofa", req)
	inside, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		_, err := l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			resp, err := createOrder("acme", req)(ctx, tx)
			close(inside)
			<-release
			return resp, err
		}, nil)
		firstDone <- err
	}()
	<-inside

	_, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.ErrorIs(t, err, ledger.ErrInProgress, "fail fast by default")
	_, err = l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Wait: ledger.NoWait})
	require.ErrorIs(t, err, ledger.ErrInProgress, "a negative wait means do not wait")
	var ip *ledger.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, in.Key, ip.Key)

	waited := make(chan ledger.Result, 1)
	go func() {
		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Wait: time.Minute})
		assertNoError(t, err)
		waited <- res
	}()
	close(release)
	require.NoError(t, <-firstDone)
	select {
	case res := <-waited:
		require.True(t, res.Replayed)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting duplicate did not replay")
	}
	require.Equal(t, 1, countOrders(t, b.pool, "acme"))
}

// Bad input gets a typed error, and nothing is left pending or half-written.
func TestDo_BadInput(t *testing.T) {
	t.Parallel()
	l, b := setup(t, &ledger.Config{MaxBodyBytes: 16})
	ctx := context.Background()
	req := order{Item: "x", Amount: 1}
	good := intent(t, "acme", "order-ok", req)
	fn := createOrder("acme", req)

	t.Run("InvalidKey", func(t *testing.T) {
		for _, k := range []string{"", strings.Repeat("k", 256), "tab\there", "ünï"} {
			in := good
			in.Key = keys.Key(k)
			_, err := l.Do(ctx, in, fn, nil)
			var ve *keys.ValidationError
			require.ErrorAs(t, err, &ve, "key %q", k)
			require.Equal(t, "key", ve.Field)
		}
	})
	t.Run("InvalidScope", func(t *testing.T) {
		in := good
		in.Scope.Tenant = ""
		_, err := l.Do(ctx, in, fn, nil)
		require.ErrorIs(t, err, keys.ErrEmpty)
	})
	t.Run("InvalidFingerprint", func(t *testing.T) {
		in := good
		in.Fingerprint = "sha1:abc"
		_, err := l.Do(ctx, in, fn, nil)
		require.ErrorIs(t, err, keys.ErrInvalidFingerprint)
	})
	t.Run("NilFunc", func(t *testing.T) {
		_, err := l.Do(ctx, good, nil, nil)
		require.ErrorContains(t, err, "nil function")
	})
	t.Run("CancelledContext", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := l.Do(cctx, good, fn, nil)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("BodyTooLarge", func(t *testing.T) {
		_, err := l.Do(ctx, intent(t, "acme", "order-big", req), fn, nil) // body is over 16 bytes
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
		var tl *ledger.BodyTooLargeError
		require.ErrorAs(t, err, &tl)
		require.Equal(t, 16, tl.Limit)
	})
	t.Run("FuncCommits", func(t *testing.T) {
		_, err := l.Do(ctx, intent(t, "acme", "order-commit", req), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			if _, err := fn(ctx, tx); err != nil {
				return ledger.Response{}, err
			}
			return ledger.Response{}, tx.Commit(ctx)
		}, nil)
		require.ErrorIs(t, err, ledger.ErrManagedTx)
	})
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
	require.Equal(t, 0, countRecords(t, b.pool, b.schema))
}

// Keys may hold any printable ASCII, quotes and backslashes included; they are data,
// never SQL.
func TestDo_KeysWithQuotes(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "q", Amount: 1}
	for _, k := range []string{`o'brien`, `a\'b`, `x'); DROP TABLE orders; --`, `\\`, `''''`} {
		in := intent(t, "ten'ant", k, req)
		in.Scope.Operation = `op\'`
		res, err := l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: ledger.ModeOptimistic})
		require.NoError(t, err, k)
		require.False(t, res.Replayed)
		res, err = l.Do(ctx, in, createOrder("acme", req), &ledger.DoOpts{Mode: ledger.ModeOptimistic})
		require.NoError(t, err, k)
		require.True(t, res.Replayed)
		rec, err := l.Get(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		require.Equal(t, in.Key, rec.Key)
	}
	require.Equal(t, 5, countOrders(t, b.pool, "acme"))
}

// A panic in the mutation rolls back and propagates.
func TestDo_PanicRollsBack(t *testing.T) {
	t.Parallel()
	l, b := setup(t, nil)
	ctx := context.Background()
	req := order{Item: "p", Amount: 1}
	in := intent(t, "acme", "order-panic", req)
	require.PanicsWithValue(t, "boom", func() {
		_, _ = l.Do(ctx, in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			_, _ = createOrder("acme", req)(ctx, tx)
			panic("boom")
		}, nil)
	})
	require.Equal(t, 0, countOrders(t, b.pool, "acme"))
	res, err := l.Do(ctx, in, createOrder("acme", req), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
}

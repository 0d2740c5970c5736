package ledger_test

// Tests of what a caller hears when an answer from PostgreSQL is lost, written against
// the documented contract: once a commit is sent, a call answers committed (nil),
// rolled back (any other error) or unknown (ledger.ErrOutcomeUnknown), and a retry with
// the same key settles an unknown one with one effect. Faults come from a TCP proxy
// (internal/faultproxy) that cuts the connection or drops the server's answers after a
// chosen round trip, and from held commits (pgtest.NewHeld) whose backend is
// terminated.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

var rtModes = []ledger.Mode{ledger.ModeClaimWithFirstStatement, ledger.ModeClaimFirst, ledger.ModeLookUpFirst, ledger.ModeOptimistic}

var rtScope = keys.Scope{Tenant: "t", Operation: "op"}

func rtIntent(k string) ledger.Intent {
	return ledger.Intent{Scope: rtScope, Key: keys.Key(k), Fingerprint: keys.FingerprintBytes([]byte("p"))}
}

// rtEnv is a migrated schema with an effects table, a ledger on a direct pool (the
// truth, read on fresh connections) and one through a fault proxy that, armed, cuts the
// connection or drops every answer after a chosen round trip (a simple Query or a
// Sync).
type rtEnv struct {
	schema string
	direct *pgxpool.Pool
	L      *ledger.Ledger
	px     *faultproxy.Proxy
	PL     *ledger.Ledger
}

func rtNewEnv(t *testing.T) *rtEnv {
	t.Helper()
	direct, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up), `CREATE TABLE effects (k text NOT NULL)`)
	L, err := ledger.New(direct, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	px := faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{})
	PL, err := ledger.New(pgtest.Pool(t, schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		px.Route(&c.ConnConfig.Config)
	}), &ledger.Config{Schema: schema})
	require.NoError(t, err)
	return &rtEnv{schema: schema, direct: direct, L: L, px: px, PL: PL}
}

func (e *rtEnv) effects(t *testing.T, k string) int {
	t.Helper()
	var n int
	require.NoError(t, e.direct.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE k = $1`, k).Scan(&n))
	return n
}

// rtEffect counts its calls and writes one effect row.
func rtEffect(k string, calls *atomic.Int32) ledger.Func {
	return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `INSERT INTO effects (k) VALUES ($1)`, k); err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{Code: 201, Body: []byte(`"` + k + `"`)}, nil
	}
}

// checkDo checks what a Do call heard against the effects and the record, then retries
// with the same key: the retry must settle it with exactly one effect.
func (e *rtEnv) checkDo(t *testing.T, label, k string, mode ledger.Mode, err error) {
	t.Helper()
	ctx := context.Background()
	n := e.effects(t, k)
	rec, gerr := e.L.Get(ctx, rtScope, keys.Key(k))
	switch {
	case err == nil:
		require.Equal(t, 1, n, "%s: heard committed", label)
		require.NoError(t, gerr, label)
		require.Equal(t, ledger.StateCompleted, rec.State, label)
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		var oe *ledger.OutcomeUnknownError
		require.ErrorAs(t, err, &oe, label)
	default:
		require.Equal(t, 0, n, "%s: heard rolled back (%v), yet the effect committed", label, err)
		require.ErrorIs(t, gerr, ledger.ErrNotFound, "%s: heard rolled back (%v), yet a record is there", label, err)
	}
	var calls atomic.Int32
	res, rerr := e.L.Do(ctx, rtIntent(k), rtEffect(k, &calls), &ledger.DoOpts{Mode: mode, Wait: 10 * time.Second})
	require.NoError(t, rerr, "%s: retry", label)
	require.Equal(t, 1, e.effects(t, k), "%s: effects after the retry", label)
	if n == 1 {
		require.True(t, res.Replayed, "%s: the first call committed, the retry must replay", label)
	}
}

// TestRedteamDoLostCommitAnswer cuts the connection after each round trip of Do in
// every mode, and terminates the backend of (or cancels the context of) a held commit:
// no call that committed hears rolled back, and a retry settles every call with one
// effect.
func TestRedteamDoLostCommitAnswer(t *testing.T) {
	e := rtNewEnv(t)
	h := pgtest.NewHeld(t, e.schema)
	HL, err := ledger.New(h.Pool, &ledger.Config{Schema: e.schema})
	require.NoError(t, err)
	ctx := context.Background()
	for _, mode := range rtModes {
		for n := 1; ; n++ {
			k := fmt.Sprintf("cut-%d-%d", mode, n)
			e.px.Arm(faultproxy.CutAfter, n, false)
			var calls atomic.Int32
			_, err := e.PL.Do(ctx, rtIntent(k), rtEffect(k, &calls), &ledger.DoOpts{Mode: mode})
			fired, at := e.px.Disarm()
			if !fired {
				if err != nil {
					// A connection an earlier round cut may still sit in the pool: the call
					// met it, and is judged as any other.
					e.px.Settle(t, e.direct)
					e.checkDo(t, fmt.Sprintf("mode %v, a pooled connection cut earlier", mode), k, mode, err)
				}
				// Do makes at least three round trips in every mode: the proxy cut two.
				require.Greater(t, n, 2, "mode %v: the proxy cut too few of Do's round trips", mode)
				break
			}
			e.px.Settle(t, e.direct)
			e.checkDo(t, fmt.Sprintf("mode %v, cut after round trip %d (%.60q)", mode, n, at), k, mode, err)
		}
		for _, how := range []string{"terminate", "cancel"} {
			k := fmt.Sprintf("held-%d-%s", mode, how)
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			var calls atomic.Int32
			go func() {
				_, err := HL.Do(cctx, rtIntent(k), rtEffect(k, &calls), &ledger.DoOpts{Mode: mode})
				done <- err
			}()
			if how == "terminate" {
				h.Terminate(ctx, t, 10*time.Second)
			} else {
				h.Wait(ctx, t, 10*time.Second)
				cancel()
			}
			err := <-done
			cancel()
			label := fmt.Sprintf("mode %v, held commit, %s", mode, how)
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, label)
			require.Eventually(t, func() bool { return e.effects(t, k) == 1 }, 10*time.Second, 2*time.Millisecond, label)
			e.checkDo(t, label, k, mode, err)
		}
	}
}

// TestRedteamFinishLostAnswer terminates the backend of, or cancels the context of,
// Claim and each finish while its statement's commit is durable and held: each hears
// unknown, never rolled back.
func TestRedteamFinishLostAnswer(t *testing.T) {
	e := rtNewEnv(t)
	h := pgtest.NewHeld(t, e.schema)
	HL, err := ledger.New(h.Pool, &ledger.Config{Schema: e.schema})
	require.NoError(t, err)
	ctx := context.Background()
	finishes := map[string]func(context.Context, *ledger.Lease) error{
		"Claim": nil,
		"Complete": func(ctx context.Context, l *ledger.Lease) error {
			_, err := HL.Complete(ctx, l, ledger.Response{Code: 200})
			return err
		},
		"Fail": func(ctx context.Context, l *ledger.Lease) error {
			return HL.Fail(ctx, l, ledger.Definitive("no", "no"))
		},
		"Release":       func(ctx context.Context, l *ledger.Lease) error { return HL.Release(ctx, l) },
		"MarkUncertain": func(ctx context.Context, l *ledger.Lease) error { return HL.MarkUncertain(ctx, l) },
		"Extend":        func(ctx context.Context, l *ledger.Lease) error { return HL.Extend(ctx, l, time.Hour) },
	}
	for name, finish := range finishes {
		for _, how := range []string{"terminate", "cancel"} {
			k := name + "-" + how
			var lease *ledger.Lease
			if finish != nil {
				c, err := e.L.Claim(ctx, rtIntent(k), &ledger.ClaimOpts{Lease: time.Minute})
				require.NoError(t, err)
				lease = c.Lease
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				if finish == nil {
					_, err := HL.Claim(cctx, rtIntent(k), &ledger.ClaimOpts{Lease: time.Minute})
					done <- err
					return
				}
				done <- finish(cctx, lease)
			}()
			if how == "terminate" {
				h.Terminate(ctx, t, 10*time.Second)
			} else {
				h.Wait(ctx, t, 10*time.Second)
				cancel()
			}
			err := <-done
			cancel()
			require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "%s, held, %s", name, how)
		}
	}
}

// TestRedteamRollbackAnswerLostReturns drops every answer from the server after a
// chosen round trip (a network partition that sends no reset) while Do's fn fails,
// with a plain error or a definitive one, and the caller's context has a deadline of
// 300ms. Do must return once the deadline passes: a context that ended while an answer
// was awaited ends the call. A call that has not returned 10s later is a failure; the
// test then closes the proxy's connections to free it.
func TestRedteamRollbackAnswerLostReturns(t *testing.T) {
	ctx := context.Background()
	fns := map[string]func(k string) ledger.Func{
		"plain error": func(k string) ledger.Func {
			return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (k) VALUES ($1)`, k); err != nil {
					return ledger.Response{}, err
				}
				return ledger.Response{}, errors.New("boom")
			}
		},
		"definitive": func(k string) ledger.Func {
			return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO effects (k) VALUES ($1)`, k); err != nil {
					return ledger.Response{}, err
				}
				return ledger.Response{}, ledger.Definitive("declined", "declined")
			}
		},
	}
	for _, mode := range rtModes {
		for name, fn := range fns {
			t.Run(fmt.Sprintf("%v/%s", mode, name), func(t *testing.T) {
				// Each blackholed round trip waits out the call's deadline and the bounded
				// rollback: the cases run side by side, each on its own proxy.
				t.Parallel()
				e := rtNewEnv(t)
				slow := 0
				for n := 1; ; n++ {
					k := fmt.Sprintf("bh-%d-%d", n, slow)
					e.px.Arm(faultproxy.Blackhole, n, false)
					cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					done := make(chan error, 1)
					go func() {
						_, err := e.PL.Do(cctx, rtIntent(k), fn(k), &ledger.DoOpts{Mode: mode})
						done <- err
					}()
					var err error
					select {
					case err = <-done:
					case <-time.After(10 * time.Second):
						_, at := e.px.Disarm()
						e.px.CloseConns()
						err = <-done
						cancel()
						t.Fatalf("answers lost after round trip %d (%.60q): Do returned only when the connection was closed, 10s after its context's deadline (%v)", n, at, err)
					}
					require.Error(t, err, "fn failed, so Do cannot succeed")
					cancel()
					if fired, _ := e.px.Disarm(); !fired {
						if errors.Is(err, context.DeadlineExceeded) && slow < 5 {
							// The deadline ended the call before its round trip n (a busy
							// machine's dial, or its wait for a connection): again.
							slow++
							n--
							continue
						}
						require.Greater(t, n, 1, "the proxy blackholed none of Do's round trips")
						return
					}
				}
			})
		}
	}
}

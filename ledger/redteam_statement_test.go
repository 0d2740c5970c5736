package ledger_test

// Red-team tests of Ledger.DoStatement, written from its documented contract only
// (go doc ./ledger DoStatement, docs/ledger.md "One statement, one round trip").
// Every test counts effects: rows st committed (rs_effects) and times st started
// (the sequence rs_started, which does not roll back), and checks that what each
// caller heard is true of them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

var rsDDL = []string{
	`CREATE SEQUENCE rs_started`,
	`CREATE TABLE rs_effects (id bigserial PRIMARY KEY, k text NOT NULL, started bigint, v int CHECK (v >= 0), u text UNIQUE)`,
	// rs_slow counts a start, then sleeps: a statement that calls it is running.
	`CREATE FUNCTION rs_slow(secs float8) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $f$
	 DECLARE n bigint; BEGIN n := nextval('rs_started'); PERFORM pg_sleep(secs); RETURN n; END $f$`,
}

type rsEnv struct {
	l *ledger.Ledger
	b *testBundle
}

// rsLong skips a long randomized test in -short runs (make test-pg's, on the other
// majors): make test runs it, and the ledger's own lost-answer and kill-storm tests run
// everywhere.
func rsLong(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a long randomized test: make test runs it")
	}
}

func rsSetup(t *testing.T, cfg *ledger.Config) *rsEnv {
	t.Helper()
	l, b := setup(t, cfg)
	for _, q := range rsDDL {
		_, err := b.pool.Exec(context.Background(), q)
		require.NoError(t, err)
	}
	return &rsEnv{l: l, b: b}
}

// ledgerOn is a ledger of the same schema and clock on another pool.
func (e *rsEnv) ledgerOn(t *testing.T, pool *pgxpool.Pool, cfg *ledger.Config) *ledger.Ledger {
	t.Helper()
	l, err := ledger.New(pool, testConfig(cfg, e.b.schema, e.b.clock))
	require.NoError(t, err)
	return l
}

// started is how many times a statement of the tests started (committed or not).
func (e *rsEnv) started(t testing.TB) int64 {
	t.Helper()
	var n int64
	var called bool
	require.NoError(t, e.b.pool.QueryRow(context.Background(), `SELECT last_value, is_called FROM rs_started`).Scan(&n, &called))
	if !called {
		return 0
	}
	return n
}

// rows is how many rows st committed for k.
func (e *rsEnv) rows(t testing.TB, k string) int {
	t.Helper()
	var n int
	require.NoError(t, e.b.pool.QueryRow(context.Background(), `SELECT count(*) FROM rs_effects WHERE k = $1`, k).Scan(&n))
	return n
}

// free reports whether k has no live record.
func (e *rsEnv) free(t testing.TB, k string) bool {
	t.Helper()
	rec, err := e.l.Get(context.Background(), rsScope, keys.Key(k))
	if errors.Is(err, ledger.ErrNotFound) {
		return true
	}
	require.NoError(t, err)
	return rec.Expired
}

var rsScope = keys.Scope{Tenant: "acme", Operation: "rs.stmt"}

func rsIn(t testing.TB, k, payload string) ledger.Intent {
	t.Helper()
	return ledger.Intent{Scope: rsScope, Key: keys.Key(k), Fingerprint: keys.FingerprintBytes([]byte(payload))}
}

// rsInsert is the mutation: one row for k, numbered by the start counter.
func rsInsert(k string) ledger.Statement {
	return ledger.Statement{
		SQL:  `INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started')) RETURNING k, started`,
		Args: []any{k}, Code: 201,
	}
}

// rsSlowInsert is rsInsert that runs for secs.
func rsSlowInsert(k string, secs float64) ledger.Statement {
	return ledger.Statement{
		SQL:  `INSERT INTO rs_effects (k, started) VALUES ($1, rs_slow($2)) RETURNING k, started`,
		Args: []any{k, secs}, Code: 201,
	}
}

func rsKind(err error) string {
	var fm *ledger.FingerprintMismatchError
	var de *ledger.DefinitiveError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		return "unknown"
	case errors.Is(err, ledger.ErrInProgress):
		return "inprogress"
	case errors.As(err, &fm):
		return "mismatch"
	case errors.As(err, &de):
		return "definitive"
	default:
		return "error"
	}
}

// activePID waits for a backend other than the test's waiting on the event marker
// (the query text of pg_stat_activity is cut at 1 kB, too short to find the statement).
func (e *rsEnv) activePID(t *testing.T, marker string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		err := e.b.pool.QueryRow(context.Background(),
			`SELECT pid FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND wait_event = $1 LIMIT 1`,
			marker).Scan(&pid)
		return err == nil
	}, 10*time.Second, 2*time.Millisecond, "no backend runs %q", marker)
	return pid
}

func (e *rsEnv) terminate(t testing.TB, pid int) {
	t.Helper()
	_, err := e.b.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
}

// settle retries k until it succeeds and checks that st committed exactly once.
func (e *rsEnv) settle(t testing.TB, l *ledger.Ledger, k, label string) ledger.Result {
	t.Helper()
	var res ledger.Result
	var err error
	for range 50 {
		res, err = l.DoStatement(context.Background(), rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: 10 * time.Second})
		if err == nil || rsKind(err) != "unknown" {
			break
		}
	}
	require.NoError(t, err, "%s: settling retry", label)
	require.Equal(t, 1, e.rows(t, k), "%s: rows after the settling retry", label)
	return res
}

// --- first call and replay -------------------------------------------------------

func TestRedteamStatement_FirstReplayAndCrossAPI(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	in := rsIn(t, "k1", "p")
	res, err := e.l.DoStatement(ctx, in, rsInsert("k1"), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 201, res.Code)
	require.Equal(t, `[{"k":"k1","started":1}]`, string(res.Body))
	require.Equal(t, int64(1), e.started(t))

	for i := range 3 {
		st := rsInsert("k1")
		st.Code = 299 // the stored code wins on replay
		rep, err := e.l.DoStatement(ctx, in, st, nil)
		require.NoError(t, err)
		require.True(t, rep.Replayed, "replay %d", i)
		require.Equal(t, res.Body, rep.Body)
		require.Equal(t, 201, rep.Code)
		require.True(t, res.CreatedAt.Equal(rep.CreatedAt), "CreatedAt %v vs %v", res.CreatedAt, rep.CreatedAt)
	}
	// A replay through Do: fn is not called.
	called := false
	rep, err := e.l.Do(ctx, in, func(context.Context, pgx.Tx) (ledger.Response, error) {
		called = true
		return ledger.Response{}, nil
	}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
	require.NoError(t, err)
	require.False(t, called)
	require.True(t, rep.Replayed)
	require.Equal(t, res.Body, rep.Body)
	require.Equal(t, int64(1), e.started(t), "no replay ran st")
	require.Equal(t, 1, e.rows(t, "k1"))

	rec, err := e.l.Get(ctx, rsScope, "k1")
	require.NoError(t, err)
	require.Equal(t, ledger.StateCompleted, rec.State)
	require.Equal(t, res.Body, rec.Response.Body)
}

// --- many callers on one key -------------------------------------------------------

func TestRedteamStatement_FiftyCallersOneKey(t *testing.T) {
	for _, wait := range []time.Duration{0, ledger.NoWait, 10 * time.Second} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			e := rsSetup(t, nil)
			const n = 50
			for round := range 3 {
				k := fmt.Sprintf("k-%d", round)
				before := e.started(t)
				var wg sync.WaitGroup
				start := make(chan struct{})
				results := make([]ledger.Result, n)
				errs := make([]error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						results[i], errs[i] = e.l.DoStatement(context.Background(), rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: wait})
					}()
				}
				close(start)
				wg.Wait()
				require.Equal(t, 1, e.rows(t, k), "one row")
				require.Equal(t, before+1, e.started(t), "st started once")
				rec, err := e.l.Get(context.Background(), rsScope, keys.Key(k))
				require.NoError(t, err)
				firsts := 0
				for i := range n {
					switch rsKind(errs[i]) {
					case "ok":
						require.Equal(t, rec.Response.Body, results[i].Body)
						require.Equal(t, 201, results[i].Code)
						if !results[i].Replayed {
							firsts++
						}
					case "inprogress":
						require.LessOrEqual(t, wait, time.Duration(0), "a waiter of %v gave up on a holder that finished in ms", wait)
					default:
						t.Fatalf("caller %d heard %v", i, errs[i])
					}
				}
				require.Equal(t, 1, firsts, "one caller ran st")
			}
		})
	}
}

// Do and DoStatement race on one key: one effect, whichever wins, and every caller hears
// the winner's response.
func TestRedteamStatement_RacesDoOnOneKey(t *testing.T) {
	e := rsSetup(t, nil)
	for round := range 4 {
		k := fmt.Sprintf("mix-%d", round)
		var fnRuns atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		const n = 40
		bodies := make([][]byte, n)
		errs := make([]error, n)
		firsts := make([]bool, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var res ledger.Result
				if i%2 == 0 {
					res, errs[i] = e.l.DoStatement(context.Background(), rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: 10 * time.Second})
				} else {
					res, errs[i] = e.l.Do(context.Background(), rsIn(t, k, "p"), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
						fnRuns.Add(1)
						_, err := tx.Exec(ctx, `INSERT INTO rs_effects (k) VALUES ($1)`, k)
						return ledger.Response{Code: 200, Body: []byte(`"do"`)}, err
					}, &ledger.DoOpts{Wait: 10 * time.Second, Mode: ledger.Mode(round % 4)})
				}
				bodies[i], firsts[i] = res.Body, !res.Replayed
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, e.rows(t, k), "round %d (Do mode %v)", round, ledger.Mode(round%4))
		rec, err := e.l.Get(context.Background(), rsScope, keys.Key(k))
		require.NoError(t, err)
		nf := 0
		for i := range n {
			require.NoError(t, errs[i], "caller %d", i)
			require.Equal(t, rec.Response.Body, bodies[i], "caller %d", i)
			if firsts[i] {
				nf++
			}
		}
		require.Equal(t, 1, nf)
	}
}

// Fifty concurrent callers of one key, forty rounds: st starts once per key, counted
// by a sequence, which does not roll back (the docs' own witness that a taken key never
// runs the statement). A caller whose statement took its snapshot before the winner
// committed, and the key's lock after, saw no record and started st, whose writes then
// rolled back at the record's primary key while the sequence kept the start: about 1
// round in 6 without a wait, 1 in 20 with one, until the look-up ahead of the statement
// took the lock.
func TestRedteamStatement_TakenKeyNeverStartsTheStatement(t *testing.T) {
	for _, wait := range []time.Duration{ledger.NoWait, 10 * time.Second} {
		e := rsSetup(t, nil)
		for round := range 40 {
			k := fmt.Sprintf("k-%d", round)
			before := e.started(t)
			var wg sync.WaitGroup
			start := make(chan struct{})
			kinds := make([]string, 50)
			for i := range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := e.l.DoStatement(context.Background(), rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: wait})
					kinds[i] = rsKind(err)
					if err == nil && !res.Replayed {
						kinds[i] = "first"
					}
				}()
			}
			close(start)
			wg.Wait()
			m := map[string]int{}
			for _, k := range kinds {
				m[k]++
			}
			require.Equal(t, 1, e.rows(t, k))
			require.Equal(t, before+1, e.started(t), "wait %v round %d: st started more than once (rows %d, answers %v)", wait, round, e.rows(t, k), m)
		}
	}
}

// Randomized: callers on a few keys, some of whose statements fail (division by zero,
// so the key is left free), with random waits.
func TestRedteamStatement_RandomizedCallersWithFailures(t *testing.T) {
	e := rsSetup(t, nil)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	const keysN, callers = 5, 60
	type call struct {
		k    string
		fail bool
		wait time.Duration
		res  ledger.Result
		err  error
	}
	calls := make([]*call, callers)
	for i := range calls {
		c := &call{k: fmt.Sprintf("rk-%d", r.IntN(keysN)), fail: r.IntN(3) == 0}
		if r.IntN(2) == 0 {
			c.wait = time.Duration(r.IntN(2000)) * time.Millisecond
		}
		calls[i] = c
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st := rsInsert(c.k)
			if c.fail {
				st.SQL = `INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started') / 0) RETURNING k, started`
			}
			c.res, c.err = e.l.DoStatement(context.Background(), rsIn(t, c.k, "p"), st, &ledger.StatementOpts{Wait: c.wait})
		}()
	}
	close(start)
	wg.Wait()
	for k := range keysN {
		key := fmt.Sprintf("rk-%d", k)
		rows := e.rows(t, key)
		require.LessOrEqual(t, rows, 1, "key %s", key)
		var body []byte
		if rows == 1 {
			rec, err := e.l.Get(context.Background(), rsScope, keys.Key(key))
			require.NoError(t, err)
			body = rec.Response.Body
		} else {
			require.True(t, e.free(t, key), "no row, so no record")
		}
		firsts := 0
		for _, c := range calls {
			if c.k != key {
				continue
			}
			switch rsKind(c.err) {
			case "ok":
				require.Equal(t, 1, rows, "a caller of %s heard success", key)
				require.Equal(t, body, c.res.Body)
				if !c.res.Replayed {
					firsts++
					require.False(t, c.fail, "a failing statement succeeded")
				}
			case "inprogress":
			case "error":
				require.True(t, c.fail, "a good statement failed: %v", c.err)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, c.err, &pgErr)
				require.Equal(t, "22012", pgErr.Code)
			default:
				t.Fatalf("caller of %s heard %v", key, c.err)
			}
		}
		require.Equal(t, rows, firsts, "key %s: one caller per row ran st", key)
	}
}

// --- a key held by Claim ---------------------------------------------------------------

func TestRedteamStatement_KeyHeldByClaim(t *testing.T) {
	ctx := context.Background()
	wait := &ledger.StatementOpts{Wait: 10 * time.Second}

	t.Run("NoWaitIsInProgress", func(t *testing.T) {
		e := rsSetup(t, nil)
		cr, err := e.l.Claim(ctx, rsIn(t, "c", "p"), &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		_, err = e.l.DoStatement(ctx, rsIn(t, "c", "p"), rsInsert("c"), nil)
		var ip *ledger.InProgressError
		require.ErrorAs(t, err, &ip)
		require.False(t, ip.LeaseUntil.IsZero(), "a Claim's lease is reported")
		t0 := time.Now()
		_, err = e.l.DoStatement(ctx, rsIn(t, "c", "p"), rsInsert("c"), &ledger.StatementOpts{Wait: 300 * time.Millisecond})
		require.ErrorIs(t, err, ledger.ErrInProgress)
		require.GreaterOrEqual(t, time.Since(t0), 250*time.Millisecond, "waited")
		require.Equal(t, int64(0), e.started(t))
		_, err = e.l.Complete(ctx, cr.Lease, ledger.Response{Code: 200, Body: []byte("ext")})
		require.NoError(t, err)
	})

	for _, how := range []string{"release", "complete", "fail"} {
		t.Run("HolderThen_"+how, func(t *testing.T) {
			e := rsSetup(t, nil)
			cr, err := e.l.Claim(ctx, rsIn(t, "c", "p"), &ledger.ClaimOpts{Lease: time.Minute})
			require.NoError(t, err)
			done := make(chan error, 1)
			var res ledger.Result
			go func() {
				var err error
				res, err = e.l.DoStatement(ctx, rsIn(t, "c", "p"), rsInsert("c"), wait)
				done <- err
			}()
			time.Sleep(300 * time.Millisecond)
			switch how {
			case "release":
				require.NoError(t, e.l.Release(ctx, cr.Lease))
			case "complete":
				_, err := e.l.Complete(ctx, cr.Lease, ledger.Response{Code: 200, Body: []byte("ext")})
				require.NoError(t, err)
			case "fail":
				require.NoError(t, e.l.Fail(ctx, cr.Lease, ledger.Definitive("declined", "no")))
			}
			select {
			case err = <-done:
			case <-time.After(8 * time.Second):
				t.Fatalf("DoStatement did not notice the holder %s", how)
			}
			switch how {
			case "release":
				require.NoError(t, err)
				require.False(t, res.Replayed)
				require.Equal(t, 1, e.rows(t, "c"))
				require.Equal(t, int64(1), e.started(t))
			case "complete":
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, "ext", string(res.Body))
				require.Equal(t, int64(0), e.started(t))
			case "fail":
				var de *ledger.DefinitiveError
				require.ErrorAs(t, err, &de)
				require.Equal(t, "declined", de.Code)
				require.True(t, de.Replayed)
				require.Equal(t, int64(0), e.started(t))
			}
		})
	}

	// A claim whose lease lapses while DoStatement waits, then whose owner comes back:
	// whatever DoStatement does, the owner and DoStatement must not both act.
	t.Run("LeaseLapsesWhileWaiting", func(t *testing.T) {
		e := rsSetup(t, nil)
		cr, err := e.l.Claim(ctx, rsIn(t, "c", "p"), &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		done := make(chan error, 1)
		var res ledger.Result
		go func() {
			var err error
			res, err = e.l.DoStatement(ctx, rsIn(t, "c", "p"), rsInsert("c"), &ledger.StatementOpts{Wait: 3 * time.Second})
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		e.b.clock.Advance(2 * time.Minute)
		err = <-done
		t.Logf("DoStatement heard: %v (replayed=%v body=%s)", err, res.Replayed, res.Body)
		_, cerr := e.l.Complete(ctx, cr.Lease, ledger.Response{Code: 200, Body: []byte("ext")})
		t.Logf("the lapsed owner's Complete heard: %v", cerr)
		switch rsKind(err) {
		case "ok":
			require.False(t, res.Replayed)
			require.Equal(t, 1, e.rows(t, "c"))
			require.ErrorIs(t, cerr, ledger.ErrLeaseLost, "st took the key over: the old owner must not complete it")
		case "inprogress":
			require.Equal(t, 0, e.rows(t, "c"))
			require.NoError(t, cerr)
		default:
			t.Fatalf("DoStatement heard %v", err)
		}
	})

	t.Run("LeaseLapsedBeforeTheCall", func(t *testing.T) {
		e := rsSetup(t, nil)
		cr, err := e.l.Claim(ctx, rsIn(t, "c", "p"), &ledger.ClaimOpts{Lease: time.Minute})
		require.NoError(t, err)
		e.b.clock.Advance(2 * time.Minute)
		res, err := e.l.DoStatement(ctx, rsIn(t, "c", "p"), rsInsert("c"), nil)
		t.Logf("DoStatement on a lapsed claim heard: %v (replayed=%v)", err, res.Replayed)
		_, cerr := e.l.Complete(ctx, cr.Lease, ledger.Response{Code: 200, Body: []byte("ext")})
		t.Logf("the lapsed owner's Complete heard: %v", cerr)
		if err == nil {
			require.Equal(t, 1, e.rows(t, "c"))
			require.ErrorIs(t, cerr, ledger.ErrLeaseLost)
		} else {
			require.Equal(t, 0, e.rows(t, "c"))
		}
	})
}

// --- a key held by Do ----------------------------------------------------------------------

// holdWithDo starts a Do on k that holds the key until release is closed, then returns
// fnErr (nil: success). It returns the backend PID of Do's transaction.
func (e *rsEnv) holdWithDo(t *testing.T, k string, release <-chan struct{}, fnErr error, done chan<- error) int {
	t.Helper()
	pid := make(chan int, 1)
	go func() {
		_, err := e.l.Do(context.Background(), rsIn(t, k, "p"), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
			pid <- int(tx.Conn().PgConn().PID())
			<-release
			if fnErr != nil {
				return ledger.Response{}, fnErr
			}
			if _, err := tx.Exec(ctx, `INSERT INTO rs_effects (k) VALUES ($1)`, k); err != nil {
				return ledger.Response{}, err
			}
			return ledger.Response{Code: 200, Body: []byte(`"do"`)}, nil
		}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
		done <- err
	}()
	select {
	case p := <-pid:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not start")
		return 0
	}
}

func TestRedteamStatement_KeyHeldByDo(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"nowait", "succeeds", "fails", "killed", "deadline"} {
		t.Run(how, func(t *testing.T) {
			e := rsSetup(t, nil)
			release := make(chan struct{})
			doDone := make(chan error, 1)
			var fnErr error
			if how == "fails" {
				fnErr = errors.New("transient")
			}
			pid := e.holdWithDo(t, "d", release, fnErr, doDone)
			opts := &ledger.StatementOpts{Wait: 10 * time.Second}
			cctx := ctx
			switch how {
			case "nowait":
				opts = nil
			case "deadline":
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
			}
			stDone := make(chan error, 1)
			var res ledger.Result
			go func() {
				var err error
				res, err = e.l.DoStatement(cctx, rsIn(t, "d", "p"), rsInsert("d"), opts)
				stDone <- err
			}()
			if how != "nowait" && how != "deadline" {
				time.Sleep(300 * time.Millisecond)
			}
			switch how {
			case "killed":
				e.terminate(t, pid)
			case "nowait", "deadline":
				err := <-stDone
				t.Logf("heard: %v", err)
				if how == "nowait" {
					require.ErrorIs(t, err, ledger.ErrInProgress)
				} else {
					require.Error(t, err)
					require.NotEqual(t, "ok", rsKind(err))
					require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ledger.ErrInProgress) || errors.Is(err, ledger.ErrOutcomeUnknown), "heard %v", err)
				}
				require.Equal(t, int64(0), e.started(t), "st did not run for a taken key")
				close(release)
				require.NoError(t, <-doDone)
				require.Equal(t, 1, e.rows(t, "d"))
				res, err := e.l.DoStatement(ctx, rsIn(t, "d", "p"), rsInsert("d"), nil)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, `"do"`, string(res.Body))
				return
			}
			close(release)
			err := <-stDone
			doErr := <-doDone
			switch how {
			case "succeeds":
				require.NoError(t, doErr)
				require.NoError(t, err)
				require.True(t, res.Replayed)
				require.Equal(t, `"do"`, string(res.Body))
				require.Equal(t, int64(0), e.started(t))
				require.Equal(t, 1, e.rows(t, "d"))
			case "fails", "killed":
				require.Error(t, doErr)
				require.NoError(t, err, "the holder failed: the waiter runs st")
				require.False(t, res.Replayed)
				require.Equal(t, int64(1), e.started(t))
				require.Equal(t, 1, e.rows(t, "d"))
			}
		})
	}
}

// --- expired, unpurged records --------------------------------------------------------

func TestRedteamStatement_ExpiredRecordRacedWithPurge(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	for round := range 5 {
		k := fmt.Sprintf("x-%d", round)
		ret := &ledger.StatementOpts{Retention: time.Hour}
		old, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), ret)
		require.NoError(t, err)
		e.b.clock.Advance(2 * time.Hour)
		before := e.started(t)
		const n = 20
		var wg sync.WaitGroup
		start := make(chan struct{})
		results := make([]ledger.Result, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				w := 5 * time.Second
				if i%3 == 0 {
					w = 0
				}
				results[i], errs[i] = e.l.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: w, Retention: time.Hour})
			}()
		}
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for range 5 {
					if _, err := e.l.Purge(ctx, nil); err != nil {
						t.Errorf("purge: %v", err)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, before+1, e.started(t), "round %d: st started once", round)
		require.Equal(t, 2, e.rows(t, k), "round %d: the old row and one new", round)
		rec, err := e.l.Get(ctx, rsScope, keys.Key(k))
		require.NoError(t, err)
		require.False(t, rec.Expired)
		require.NotEqual(t, old.Body, rec.Response.Body)
		firsts := 0
		for i := range n {
			switch rsKind(errs[i]) {
			case "ok":
				require.Equal(t, rec.Response.Body, results[i].Body, "round %d caller %d", round, i)
				if !results[i].Replayed {
					firsts++
				}
			case "inprogress":
			default:
				t.Fatalf("round %d caller %d heard %v", round, i, errs[i])
			}
		}
		require.Equal(t, 1, firsts)
	}
}

// An expired record of another payload is a new intent, not a mismatch; the record of
// Do expires the same way.
func TestRedteamStatement_ExpiredRecordOfDoOtherPayload(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	_, err := e.l.Do(ctx, rsIn(t, "e", "old"), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		return ledger.Response{Body: []byte(`"old"`)}, nil
	}, &ledger.DoOpts{Retention: time.Hour})
	require.NoError(t, err)
	_, err = e.l.DoStatement(ctx, rsIn(t, "e", "new"), rsInsert("e"), nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
	e.b.clock.Advance(2 * time.Hour)
	res, err := e.l.DoStatement(ctx, rsIn(t, "e", "new"), rsInsert("e"), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, e.rows(t, "e"))
	rep, err := e.l.DoStatement(ctx, rsIn(t, "e", "new"), rsInsert("e"), nil)
	require.NoError(t, err)
	require.True(t, rep.Replayed)
	require.Equal(t, res.Body, rep.Body)
}

// --- lost answers and ended contexts --------------------------------------------------------

func TestRedteamStatement_BackendTerminatedDuringStatement(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	for i := range 3 {
		k := fmt.Sprintf("t-%d", i)
		done := make(chan error, 1)
		go func() {
			_, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), rsSlowInsert(k, 5), nil)
			done <- err
		}()
		e.terminate(t, e.activePID(t, "PgSleep"))
		err := <-done
		require.Error(t, err)
		require.Equal(t, 0, e.rows(t, k), "killed before its commit")
		require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "a FATAL is a lost answer: %v", err)
		e.settle(t, e.l, k, k)
	}
}

func TestRedteamStatement_ContextEndsDuringStatement(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.l.DoStatement(cctx, rsIn(t, "c", "p"), rsSlowInsert("c", 5), nil)
		done <- err
	}()
	e.activePID(t, "PgSleep")
	cancel()
	err := <-done
	t.Logf("heard: %v", err)
	require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, "the context ended once the statement was sent")
	require.Eventually(t, func() bool { return e.free(t, "c") }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 0, e.rows(t, "c"))
	e.settle(t, e.l, "c", "c")
}

// A commit made durable whose answer is lost: the caller must hear unknown, never
// rolled back, and the retry replays.
func TestRedteamStatement_HeldCommitTerminatedOrCancelled(t *testing.T) {
	e := rsSetup(t, nil)
	h := pgtest.NewHeld(t, e.b.schema)
	hl := e.ledgerOn(t, h.Pool, nil)
	ctx := context.Background()
	for _, how := range []string{"terminate", "cancel"} {
		k := "held-" + how
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := hl.DoStatement(cctx, rsIn(t, k, "p"), rsInsert(k), nil)
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
		require.ErrorIs(t, err, ledger.ErrOutcomeUnknown, how)
		require.Eventually(t, func() bool { return e.rows(t, k) == 1 }, 10*time.Second, 2*time.Millisecond, how)
		before := e.started(t)
		res := e.settle(t, e.l, k, how)
		require.True(t, res.Replayed, "%s: the statement committed; the retry replays", how)
		require.Equal(t, before, e.started(t))
	}
}

// Calls on unique keys with random deadlines: a call that heard a plain error
// committed nothing, ever; a call that heard success committed; an unknown is settled.
func TestRedteamStatement_RandomDeadlines(t *testing.T) {
	rsLong(t)
	e := rsSetup(t, nil)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	kinds := map[string]int{}
	var plain []string
	for i := range 300 {
		k := fmt.Sprintf("dl-%d", i)
		st := rsInsert(k)
		if i%2 == 1 {
			st = rsSlowInsert(k, float64(r.IntN(10))/1000)
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(8000))*time.Microsecond)
		_, err := e.l.DoStatement(cctx, rsIn(t, k, "p"), st, nil)
		cancel()
		kind := rsKind(err)
		kinds[kind]++
		switch kind {
		case "ok":
			require.Equal(t, 1, e.rows(t, k), "%s heard success", k)
		case "unknown":
			e.settle(t, e.l, k, k)
		case "error":
			plain = append(plain, k)
		default:
			t.Fatalf("%s heard %v", k, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // anything still running has ended by now
	for _, k := range plain {
		require.Equal(t, 0, e.rows(t, k), "%s heard a plain error but committed", k)
		require.True(t, e.free(t, k), "%s heard a plain error but its key is taken", k)
	}
	t.Logf("answers: %v", kinds)
}

// The connection is cut after each round trip of a first call on a fresh connection
// (which prepares the statement), and lost answers are injected at random.
func TestRedteamStatement_ProxyCutsAndLostAnswers(t *testing.T) {
	rsLong(t)
	e := rsSetup(t, nil)
	ctx := context.Background()
	px := faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{})
	pl := e.ledgerOn(t, pgtest.Pool(t, e.b.schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		px.Route(&c.ConnConfig.Config)
	}), nil)
	check := func(label, k string, err error) {
		px.Settle(t, e.b.pool)
		switch rsKind(err) {
		case "ok":
			require.Equal(t, 1, e.rows(t, k), label)
		case "unknown":
			e.settle(t, e.l, k, label)
		case "error":
			require.Equal(t, 0, e.rows(t, k), "%s: heard %v, yet committed", label, err)
			require.True(t, e.free(t, k), label)
			e.settle(t, e.l, k, label)
		default:
			t.Fatalf("%s: heard %v", label, err)
		}
	}
	for n := 1; n < 10; n++ {
		px.CloseConns()
		k := fmt.Sprintf("cut-%d", n)
		px.Arm(faultproxy.CutAfter, n, false)
		_, err := pl.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), nil)
		fired, at := px.Disarm()
		t.Logf("cut after %d (fired=%v %.80q): %v", n, fired, at, err)
		check(fmt.Sprintf("cut after %d", n), k, err)
		if !fired {
			break
		}
	}
	// The same cuts on fresh connections in every pgx exec mode.
	for _, mode := range pgtest.ExecModes {
		for n := 1; n < 10; n++ {
			mpl := e.ledgerOn(t, pgtest.Pool(t, e.b.schema, func(c *pgxpool.Config) {
				c.MaxConns = 1
				c.ConnConfig.DefaultQueryExecMode = mode
				px.Route(&c.ConnConfig.Config)
			}), nil)
			k := fmt.Sprintf("cut-%v-%d", mode, n)
			// A first call on the connection, so that the cut falls on a later one too.
			_, err := mpl.DoStatement(ctx, rsIn(t, k+"-warm", "p"), rsInsert(k+"-warm"), nil)
			require.NoError(t, err)
			px.Arm(faultproxy.CutAfter, n, false)
			_, err = mpl.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), nil)
			fired, at := px.Disarm()
			check(fmt.Sprintf("mode %v cut after %d (%.60q)", mode, n, at), k, err)
			if !fired {
				break
			}
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	px2 := faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{Seed: seed, SyncLost: 0.1, SyncFatal: 0.1, Cut: 0.02, CutAnswer: 0.02, HalfClose: 0.01})
	pl2 := e.ledgerOn(t, pgtest.Pool(t, e.b.schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		px2.Route(&c.ConnConfig.Config)
	}), nil)
	kinds := map[string]int{}
	for i := range 200 {
		k := fmt.Sprintf("storm-%d", i)
		_, err := pl2.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), nil)
		kinds[rsKind(err)]++
		px2.SetEnabled(false)
		check(k, k, err)
		px2.SetEnabled(true)
	}
	t.Logf("answers: %v", kinds)
}

// Workers on a few keys while another connection terminates their backends at random.
func TestRedteamStatement_KillStorm(t *testing.T) {
	rsLong(t)
	e := rsSetup(t, nil)
	vl := e.ledgerOn(t, pgtest.Pool(t, e.b.schema, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["application_name"] = "rs_victim"
	}), nil)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx, stop := context.WithTimeout(context.Background(), 4*time.Second)
	defer stop()
	var kills atomic.Int64
	go func() {
		r := rand.New(rand.NewPCG(seed, 3))
		for ctx.Err() == nil {
			time.Sleep(time.Duration(r.IntN(5000)) * time.Microsecond)
			var n int64
			_ = e.b.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity
				WHERE application_name = 'rs_victim' AND state = 'active' ORDER BY random() LIMIT 1) p`).Scan(&n)
			kills.Add(n)
		}
	}()
	type rec struct {
		k   string
		res ledger.Result
		err error
	}
	var mu sync.Mutex
	var got []rec
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(10+w)))
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("ks-%d", r.IntN(40))
				if w%2 == 1 {
					k = fmt.Sprintf("ku-%d-%d", w, i) // a key of this call alone
				}
				st := rsInsert(k)
				if r.IntN(2) == 0 {
					st = rsSlowInsert(k, 0.002)
				}
				res, err := vl.DoStatement(context.Background(), rsIn(t, k, "p"), st, &ledger.StatementOpts{Wait: time.Duration(r.IntN(100)) * time.Millisecond})
				mu.Lock()
				got = append(got, rec{k, res, err})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	kinds := map[string]int{}
	msgs := map[string]int{}
	for _, c := range got {
		kinds[rsKind(c.err)]++
		n := e.rows(t, c.k)
		require.LessOrEqual(t, n, 1, c.k)
		switch rsKind(c.err) {
		case "ok":
			require.Equal(t, 1, n, "%s heard success", c.k)
			r, err := e.l.Get(context.Background(), rsScope, keys.Key(c.k))
			require.NoError(t, err)
			require.Equal(t, r.Response.Body, c.res.Body)
		case "error":
			msgs[fmt.Sprintf("%.90s", c.err.Error())]++
			if strings.HasPrefix(c.k, "ku-") {
				require.Equal(t, 0, n, "%s heard %v, yet committed", c.k, c.err)
				require.True(t, e.free(t, c.k), "%s heard %v, yet its key is taken", c.k, c.err)
			}
		case "unknown", "inprogress":
		default:
			t.Fatalf("%s heard %v", c.k, c.err)
		}
	}
	for i := range 40 {
		k := fmt.Sprintf("ks-%d", i)
		e.settle(t, e.l, k, k)
	}
	t.Logf("%d calls, %d kills, answers %v, plain errors %v", len(got), kills.Load(), kinds, msgs)
}

// --- failing statements ---------------------------------------------------------------------

func TestRedteamStatement_FailingStatementStoresNothing(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	_, err := e.b.pool.Exec(ctx, `INSERT INTO rs_effects (k, u) VALUES ('seed', 'taken')`)
	require.NoError(t, err)
	cases := map[string]struct {
		sql  string
		code string
	}{
		"unique":   {`INSERT INTO rs_effects (k, started, u) VALUES ($1, nextval('rs_started'), 'taken') RETURNING k`, "23505"},
		"divzero":  {`INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started') / 0) RETURNING k`, "22012"},
		"check":    {`INSERT INTO rs_effects (k, started, v) VALUES ($1, nextval('rs_started'), -1) RETURNING k`, "23514"},
		"notnull":  {`UPDATE rs_effects SET k = NULL WHERE k = 'seed' AND $1::text IS NOT NULL AND nextval('rs_started') > 0 RETURNING id`, "23502"},
		"cteFirst": {`WITH a AS (INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started')) RETURNING id) INSERT INTO rs_effects (k, v) SELECT $1, -1 FROM a RETURNING id`, "23514"},
		"raise":    {`INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started')) RETURNING k, 1/(id - id)`, "22012"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			k := "f-" + name
			before := e.started(t)
			_, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: c.sql, Args: []any{k}}, nil)
			require.Equal(t, "error", rsKind(err), "heard %v", err)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, c.code, pgErr.Code)
			require.Greater(t, e.started(t), before, "st ran (after the claim)")
			require.Equal(t, 0, e.rows(t, k))
			require.True(t, e.free(t, k))
			res, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, 1, e.rows(t, k))
		})
	}
	var n int
	require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT count(*) FROM rs_effects WHERE k = 'seed' AND k IS NOT NULL`).Scan(&n))
	require.Equal(t, 1, n)
}

// --- bodies ---------------------------------------------------------------------------------------

func TestRedteamStatement_BodiesAndReplayBytes(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	_, err := e.b.pool.Exec(ctx, `CREATE TABLE rs_types (id serial PRIMARY KEY, j json, jb jsonb, by bytea, nu numeric, ts timestamptz, t text, arr int[], f float8)`)
	require.NoError(t, err)
	cases := []struct {
		name, sql string
		args      []any
		check     func(t *testing.T, body []byte)
	}{
		{"zeroRows", `UPDATE rs_effects SET v = 1 WHERE false RETURNING id`, nil, func(t *testing.T, b []byte) {
			require.Equal(t, "[]", string(b))
		}},
		{"manyRows", `INSERT INTO rs_effects (k) SELECT 'many' FROM generate_series(1, 2000) RETURNING id, k`, nil, func(t *testing.T, b []byte) {
			var rows []map[string]any
			require.NoError(t, json.Unmarshal(b, &rows))
			require.Len(t, rows, 2000)
		}},
		{"types", `INSERT INTO rs_types (j, jb, by, nu, ts, t, arr, f) VALUES ($1::json, $2::jsonb, $3, $4::numeric, $5, $6, $7, $8) RETURNING *, NULL::text AS nothing`,
			[]any{`{"b":1, "a":[1,2]}`, `{"b":1,"a":null}`, []byte{0, 1, 0xff}, "12345678901234567890.000000000001", time.Date(2020, 1, 2, 3, 4, 5, 123456000, time.UTC),
				"quote\" backslash\\ newline\n tab\t é 😀 \u2028", []int32{1, 2}, 1e300},
			func(t *testing.T, b []byte) {
				var rows []map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(b, &rows), "%s", b)
				require.Len(t, rows, 1)
				r := rows[0]
				require.JSONEq(t, `{"b":1, "a":[1,2]}`, string(r["j"]))
				require.Equal(t, `null`, string(r["nothing"]))
				require.Equal(t, `12345678901234567890.000000000001`, string(r["nu"]))
				var s string
				require.NoError(t, json.Unmarshal(r["t"], &s))
				require.Equal(t, "quote\" backslash\\ newline\n tab\t é 😀 \u2028", s)
				require.NoError(t, json.Unmarshal(r["by"], &s))
				require.Equal(t, `\x0001ff`, s)
			}},
		{"internalNames", `INSERT INTO rs_effects (k) VALUES ('names') RETURNING k AS tenant, k AS key, k AS body, k AS state, k AS fingerprint, k AS oncekit_x, k AS "k;COMMIT", id AS id, id AS id`, nil,
			func(t *testing.T, b []byte) {
				require.Contains(t, string(b), `"oncekit_x":"names"`)
				require.Contains(t, string(b), `"k;COMMIT":"names"`)
				require.Contains(t, string(b), `"tenant":"names"`)
			}},
		{"nullRow", `INSERT INTO rs_effects (k) VALUES ('nul') RETURNING NULL::int AS a, NULL::json AS b`, nil, func(t *testing.T, b []byte) {
			require.Equal(t, `[{"a":null,"b":null}]`, string(b))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := rsIn(t, "b-"+c.name, "p")
			st := ledger.Statement{SQL: c.sql, Args: c.args, Code: 7}
			res, err := e.l.DoStatement(ctx, in, st, nil)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, 7, res.Code)
			require.True(t, json.Valid(res.Body), "%s", res.Body)
			c.check(t, res.Body)
			// Compare with row_to_json of the same rows, on its own.
			rep, err := e.l.DoStatement(ctx, in, st, nil)
			require.NoError(t, err)
			require.True(t, rep.Replayed)
			require.Equal(t, res.Body, rep.Body, "replay bytes")
		})
	}
	// The body of a row is row_to_json's.
	res, err := e.l.DoStatement(ctx, rsIn(t, "b-r2j", "p"), ledger.Statement{SQL: `UPDATE rs_types SET f = f WHERE id = 1 RETURNING *`}, nil)
	require.NoError(t, err)
	var want string
	require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT '[' || row_to_json(r)::text || ']' FROM rs_types r WHERE id = 1`).Scan(&want))
	require.Equal(t, want, string(res.Body))
}

func TestRedteamStatement_BodyTooLarge(t *testing.T) {
	e := rsSetup(t, &ledger.Config{MaxBodyBytes: 200})
	ctx := context.Background()
	st := ledger.Statement{SQL: `INSERT INTO rs_effects (k, started) SELECT $1, nextval('rs_started') FROM generate_series(1, 20) RETURNING k, started`, Args: []any{"big"}}
	_, err := e.l.DoStatement(ctx, rsIn(t, "big", "p"), st, nil)
	var bt *ledger.BodyTooLargeError
	require.ErrorAs(t, err, &bt)
	require.Equal(t, 200, bt.Limit)
	require.Greater(t, bt.Size, 200)
	require.Equal(t, 0, e.rows(t, "big"))
	require.True(t, e.free(t, "big"))
	res, err := e.l.DoStatement(ctx, rsIn(t, "big", "p"), rsInsert("big"), nil)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, e.rows(t, "big"))
}

// --- hostile SQL ----------------------------------------------------------------------------------

func TestRedteamStatement_HostileSQL(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	ins := `INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started'))`
	// refuse: must be refused, with nothing run and nothing stored.
	refuse := map[string]ledger.Statement{
		"secondStatement":      {SQL: ins + ` RETURNING k; DELETE FROM rs_effects RETURNING k`},
		"secondAfterComment":   {SQL: ins + ` RETURNING k /* c */; DELETE FROM rs_effects`},
		"secondAfterLineComm":  {SQL: ins + " RETURNING k -- c\n; DELETE FROM rs_effects"},
		"commit":               {SQL: ins + ` RETURNING k; COMMIT`},
		"beginFirst":           {SQL: `BEGIN; ` + ins + ` RETURNING k`},
		"savepoint":            {SQL: `SAVEPOINT a`},
		"noReturning":          {SQL: ins},
		"returningInString":    {SQL: `INSERT INTO rs_effects (k, started) VALUES ($1 || ' RETURNING k', nextval('rs_started'))`},
		"returningInComment":   {SQL: ins + ` /* RETURNING k */`},
		"returningInCTEOnly":   {SQL: `WITH a AS (` + ins + ` RETURNING k) UPDATE rs_effects SET v = 1 WHERE k = (SELECT k FROM a)`},
		"dollar2":              {SQL: ins + ` RETURNING k, $2::int`},
		"dollar99":             {SQL: ins + ` RETURNING k, $99::int`},
		"select":               {SQL: `SELECT nextval('rs_started'), $1::text`},
		"selectWriterFunc":     {SQL: `SELECT rs_slow(0), $1::text`},
		"values":               {SQL: `VALUES (nextval('rs_started'), $1::text)`},
		"explainAnalyze":       {SQL: `EXPLAIN ANALYZE ` + ins + ` RETURNING k`},
		"do":                   {SQL: `DO $$BEGIN PERFORM nextval('rs_started'); END$$`},
		"truncate":             {SQL: `TRUNCATE rs_effects`},
		"call":                 {SQL: `CALL nothing($1)`},
		"backslashQuoteEscape": {SQL: ins + ` RETURNING k, 'a\'; DELETE FROM rs_effects RETURNING k; SELECT ''' AS x`},
		"doubleSemicolon":      {SQL: ins + ` RETURNING k;; DELETE FROM rs_effects RETURNING k`},
		"unterminatedString":   {SQL: ins + ` RETURNING k, 'abc`},
		"unterminatedComment":  {SQL: ins + ` RETURNING k /* abc`},
		"parenthesizedSelect":  {SQL: `(SELECT nextval('rs_started'), $1::text)`},
		"merge":                {SQL: `MERGE INTO rs_effects e USING (SELECT $1::text k) s ON false WHEN NOT MATCHED THEN INSERT (k, started) VALUES (s.k, nextval('rs_started'))`},
		"rollback":             {SQL: `ROLLBACK`},
		"selectInto":           {SQL: `SELECT nextval('rs_started') INTO rs_evil, $1::text`},
		"createTableAs":        {SQL: `CREATE TABLE rs_evil AS ` + ins + ` RETURNING k`},
		"setConfig":            {SQL: `SET statement_timeout = 1`},
	}
	// accept: legal single statements; must run once and be replayed.
	accept := map[string]ledger.Statement{
		"trailingSemicolon":    {SQL: ins + ` RETURNING k;`},
		"trailingSemiSpace":    {SQL: ins + " RETURNING k ;  \n"},
		"semicolonInString":    {SQL: ins + ` RETURNING k, '; DELETE FROM rs_effects; COMMIT; BEGIN' AS s`},
		"semicolonInComment":   {SQL: ins + ` RETURNING k /* ; DELETE FROM rs_effects; COMMIT */`},
		"lineCommentInside":    {SQL: ins + " -- ; DELETE FROM rs_effects\n RETURNING k"},
		"nestedCommentHides":   {SQL: ins + ` RETURNING k /* /* */ ; DELETE FROM rs_effects RETURNING k; -- */`},
		"semicolonThenComment": {SQL: ins + ` RETURNING k; -- done`},
		"nestedComment":        {SQL: ins + ` RETURNING k /* outer /* inner */ ; DELETE FROM rs_effects; */`},
		"leadingComment":       {SQL: "/* hi; */ -- there\n  " + ins + ` RETURNING k`},
		"lowercase":            {SQL: strings.ToLower(`INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started')) returning k`)},
		"dollarQuote":          {SQL: ins + ` RETURNING k, $$; DELETE FROM rs_effects; COMMIT $$ AS s`},
		"taggedDollarQuote":    {SQL: ins + ` RETURNING k, $a$; $$ ; COMMIT; $a$ AS s`},
		"eString":              {SQL: ins + ` RETURNING k, E'it\'s; COMMIT' AS s`},
		"quotedIdentifier":     {SQL: ins + ` RETURNING k AS "a;COMMIT"`},
		"dollarInString":       {SQL: ins + ` RETURNING k, '$9' AS s`},
		"dollarInComment":      {SQL: ins + ` RETURNING k /* $9 */`},
		"withInsert":           {SQL: `WITH a AS (` + ins + ` RETURNING k) SELECT k FROM a`},
		"withTwoWrites":        {SQL: `WITH a AS (` + ins + ` RETURNING k), b AS (UPDATE rs_effects SET v = 1 WHERE k = 'zz' RETURNING k) SELECT k FROM a`},
		"update":               {SQL: `UPDATE rs_effects SET started = nextval('rs_started') WHERE k = $1 RETURNING k`},
		"delete":               {SQL: `DELETE FROM rs_effects WHERE k = $1 AND nextval('rs_started') > 0 RETURNING k`},
		"withRecursiveInsert":  {SQL: `WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 1) INSERT INTO rs_effects (k, started) SELECT $1, nextval('rs_started') FROM s RETURNING k`},
		"commitInString":       {SQL: ins + ` RETURNING k, 'COMMIT' AS c, 'BEGIN' AS b, 'ROLLBACK' AS r`},
		"returningStar":        {SQL: ins + ` RETURNING *`},
		"returningOne":         {SQL: ins + ` RETURNING 1`},
		"insertOnConflict":     {SQL: ins + ` ON CONFLICT DO NOTHING RETURNING k`},
		"parenthesizedInsert":  {SQL: `WITH a AS (` + ins + ` RETURNING k) SELECT * FROM a`},
		"unicodeIdentifier":    {SQL: ins + ` RETURNING k AS U&"d\0061t\+000061"`},
	}
	var holes []string
	for name, st := range refuse {
		t.Run("refuse_"+name, func(t *testing.T) {
			k := "h-" + name
			st.Args = []any{k}
			before := e.started(t)
			var total int
			require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT count(*) FROM rs_effects`).Scan(&total))
			_, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), st, nil)
			var pgErr *pgconn.PgError
			sentToServer := errors.As(err, &pgErr)
			t.Logf("heard: %v (from the server: %v)", err, sentToServer)
			var total2 int
			require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT count(*) FROM rs_effects`).Scan(&total2))
			_, evilErr := e.b.pool.Exec(ctx, `SELECT 1 FROM rs_evil`)
			if err == nil || e.started(t) != before || total2 != total || !e.free(t, k) || evilErr == nil {
				holes = append(holes, fmt.Sprintf("%s: err=%v started+%d rows %d->%d free=%v", name, err, e.started(t)-before, total, total2, e.free(t, k)))
			}
			require.Error(t, err)
			require.Equal(t, before, e.started(t), "nothing ran")
			require.Equal(t, total, total2, "nothing written")
			require.True(t, e.free(t, k), "nothing stored")
			require.Error(t, evilErr, "no table created")
		})
	}
	for name, st := range accept {
		t.Run("accept_"+name, func(t *testing.T) {
			k := "h-" + name
			st.Args = []any{k}
			if name == "update" || name == "delete" {
				_, err := e.b.pool.Exec(ctx, `INSERT INTO rs_effects (k) VALUES ($1)`, k)
				require.NoError(t, err)
			}
			var total int
			require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT count(*) FROM rs_effects`).Scan(&total))
			before := e.started(t)
			res, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), st, nil)
			require.NoError(t, err, "a legal statement")
			require.False(t, res.Replayed)
			var total2 int
			require.NoError(t, e.b.pool.QueryRow(ctx, `SELECT count(*) FROM rs_effects`).Scan(&total2))
			require.LessOrEqual(t, total2-total, 1, "no hidden statement deleted or added rows")
			require.GreaterOrEqual(t, total2-total, -1)
			rep, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), st, nil)
			require.NoError(t, err)
			require.True(t, rep.Replayed)
			require.Equal(t, res.Body, rep.Body)
			require.LessOrEqual(t, e.started(t)-before, int64(1))
		})
	}
	t.Logf("holes: %v", holes)
}

// What the docs leave to the caller: a statement that writes the ledger's table, a WITH
// query named oncekit_... . Only the behaviour is noted; no effect may happen twice.
func TestRedteamStatement_CallersDuties(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	for name, sql := range map[string]string{
		"oncekitCTE":  `WITH oncekit_claim AS (INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started')) RETURNING k) SELECT k FROM oncekit_claim`,
		"ledgerTable": `DELETE FROM idempotency_records WHERE key = $1 RETURNING key`,
		// The docs say "a WITH query of them" (go doc) and "a WITH query" (docs/ledger.md):
		// a WITH query that writes nothing is accepted.
		"withOnlySelect": `WITH a AS (SELECT nextval('rs_started') n) SELECT n, $1::text AS k FROM a`,
		"ledgerTableUp":  `UPDATE idempotency_records SET state = state WHERE key <> $1 RETURNING key`,
	} {
		t.Run(name, func(t *testing.T) {
			k := "duty-" + name
			res, err := e.l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: sql, Args: []any{k}}, nil)
			t.Logf("heard: %v body=%.100s", err, res.Body)
			res2, err2 := e.l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: sql, Args: []any{k}}, nil)
			t.Logf("again: %v replayed=%v", err2, res2.Replayed)
			require.LessOrEqual(t, e.rows(t, k), 1)
			if err == nil {
				require.NoError(t, err2)
				require.True(t, res2.Replayed)
				require.Equal(t, res.Body, res2.Body)
			}
		})
	}
}

// A legal statement that ends in a line comment ("... RETURNING id -- new order", with
// or without a newline or a semicolon after it), or whose WITH list ends in one, runs:
// the comment once swallowed what the ledger puts after the statement on the same line,
// and the server refused it with a syntax error at a word the caller never wrote.
func TestRedteamStatement_TrailingLineComment(t *testing.T) {
	e := rsSetup(t, nil)
	ins := `INSERT INTO rs_effects (k, started) VALUES ($1, nextval('rs_started'))`
	for i, sql := range []string{ins + ` RETURNING k -- new order`, ins + " RETURNING k -- new order\n", ins + " RETURNING k -- c\n;",
		"WITH a AS (" + ins + " RETURNING k) -- the order\nSELECT k FROM a"} {
		k := fmt.Sprintf("lc-%d", i)
		res, err := e.l.DoStatement(context.Background(), rsIn(t, k, "p"), ledger.Statement{SQL: sql, Args: []any{k}}, nil)
		require.NoError(t, err, "%q", sql)
		require.Equal(t, `[{"k":"`+k+`"}]`, string(res.Body))
		require.Equal(t, 1, e.rows(t, k))
	}
}

// --- mismatch and stored failures ------------------------------------------------------------

func TestRedteamStatement_MismatchAndDefinitive(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	// Do's record, then DoStatement with another payload.
	_, err := e.l.Do(ctx, rsIn(t, "m", "A"), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		return ledger.Response{Code: 200, Body: []byte(`{"by":"do"}`), ResourceRef: "r/1"}, nil
	}, nil)
	require.NoError(t, err)
	_, err = e.l.DoStatement(ctx, rsIn(t, "m", "B"), rsInsert("m"), &ledger.StatementOpts{Wait: time.Second})
	var fm *ledger.FingerprintMismatchError
	require.ErrorAs(t, err, &fm)
	require.Equal(t, rsIn(t, "m", "A").Fingerprint, fm.StoredFingerprint)
	require.Equal(t, rsIn(t, "m", "B").Fingerprint, fm.Fingerprint)
	require.Equal(t, ledger.StateCompleted, fm.StoredState)
	res, err := e.l.DoStatement(ctx, rsIn(t, "m", "A"), rsInsert("m"), nil)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, `{"by":"do"}`, string(res.Body))
	require.Equal(t, "r/1", res.ResourceRef)

	// A stored failure from Do.
	_, err = e.l.Do(ctx, rsIn(t, "f", "A"), func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO rs_effects (k) VALUES ('f')`); err != nil {
			return ledger.Response{}, err
		}
		return ledger.Response{}, &ledger.DefinitiveError{Code: "declined", Message: "no", Response: &ledger.Response{Code: 402, Body: []byte(`"declined"`)}}
	}, nil)
	require.Error(t, err)
	for range 2 {
		_, err = e.l.DoStatement(ctx, rsIn(t, "f", "A"), rsInsert("f"), nil)
		var de *ledger.DefinitiveError
		require.ErrorAs(t, err, &de)
		require.Equal(t, "declined", de.Code)
		require.Equal(t, "no", de.Message)
		require.True(t, de.Replayed)
		require.NotNil(t, de.Response)
		require.Equal(t, `"declined"`, string(de.Response.Body))
	}
	_, err = e.l.DoStatement(ctx, rsIn(t, "f", "B"), rsInsert("f"), nil)
	require.ErrorAs(t, err, &fm)
	require.Equal(t, ledger.StateFailed, fm.StoredState)

	// DoStatement's record, then Do and DoStatement with another payload.
	_, err = e.l.DoStatement(ctx, rsIn(t, "s", "A"), rsInsert("s"), nil)
	require.NoError(t, err)
	called := false
	_, err = e.l.Do(ctx, rsIn(t, "s", "B"), func(context.Context, pgx.Tx) (ledger.Response, error) {
		called = true
		return ledger.Response{}, nil
	}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst})
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)
	require.False(t, called)
	_, err = e.l.DoStatement(ctx, rsIn(t, "s", "B"), rsInsert("s"), nil)
	require.ErrorIs(t, err, ledger.ErrFingerprintMismatch)

	require.Equal(t, int64(1), e.started(t), "st ran only for s")
	require.Equal(t, 0, e.rows(t, "m"))
	require.Equal(t, 0, e.rows(t, "f"))
	require.Equal(t, 1, e.rows(t, "s"))
}

// --- input checks ---------------------------------------------------------------------------------

func TestRedteamStatement_BadInputRunsNothing(t *testing.T) {
	e := rsSetup(t, nil)
	ctx := context.Background()
	bad := map[string]ledger.Intent{
		"zero":     {},
		"noFP":     {Scope: rsScope, Key: "k"},
		"badKey":   {Scope: rsScope, Key: "a\x00b", Fingerprint: rsIn(t, "k", "p").Fingerprint},
		"noTenant": {Scope: keys.Scope{Operation: "x"}, Key: "k", Fingerprint: rsIn(t, "k", "p").Fingerprint},
	}
	for name, in := range bad {
		_, err := e.l.DoStatement(ctx, in, rsInsert("k"), nil)
		var ve *keys.ValidationError
		require.ErrorAs(t, err, &ve, name)
	}
	_, err := e.l.DoStatement(ctx, rsIn(t, "k", "p"), rsInsert("k"), &ledger.StatementOpts{Retention: -time.Hour})
	t.Logf("negative retention: %v", err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.l.DoStatement(cctx, rsIn(t, "k2", "p"), rsInsert("k2"), nil)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "nothing was sent")
	require.Equal(t, int64(0)+int64(e.rows(t, "k")), e.started(t))
	require.Equal(t, 0, e.rows(t, "k2"))
}

// --- every exec mode, named args ----------------------------------------------------------

func TestRedteamStatement_EveryExecModeAndNamedArgs(t *testing.T) {
	e := rsSetup(t, nil)
	pgtest.EachExecMode(t, e.b.schema, func(t *testing.T, pool *pgxpool.Pool) {
		l := e.ledgerOn(t, pool, nil)
		ctx := context.Background()
		p := fmt.Sprintf("%p", pool)
		// Named args, with an @name inside a string left alone.
		k := "named-" + p
		st := ledger.Statement{SQL: `INSERT INTO rs_effects (k, v) VALUES (@k, @v) RETURNING k, v, '@k' AS lit`, Args: []any{pgx.NamedArgs{"k": k, "v": 3}}}
		res, err := l.DoStatement(ctx, rsIn(t, k, "p"), st, nil)
		require.NoError(t, err)
		require.Equal(t, `[{"k":"`+k+`","v":3,"lit":"@k"}]`, string(res.Body))
		rep, err := l.DoStatement(ctx, rsIn(t, k, "p"), st, nil)
		require.NoError(t, err)
		require.True(t, rep.Replayed)
		require.Equal(t, res.Body, rep.Body)
		require.Equal(t, 1, e.rows(t, k))

		// A failing statement, then a good one on the same connection.
		k = "fail-" + p
		_, err = l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: `INSERT INTO rs_effects (k, v) VALUES ($1, -1) RETURNING k`, Args: []any{k}}, nil)
		require.Equal(t, "error", rsKind(err))
		require.True(t, e.free(t, k))
		_, err = l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: `INSERT INTO rs_effects (k, v) VALUES ($1, 1) RETURNING k`, Args: []any{k}}, nil)
		require.NoError(t, err)
		require.Equal(t, 1, e.rows(t, k))

		// Refused $n.
		_, err = l.DoStatement(ctx, rsIn(t, "d-"+p, "p"), ledger.Statement{SQL: `INSERT INTO rs_effects (k) VALUES ($2) RETURNING k`, Args: []any{"x"}}, nil)
		require.Error(t, err)
		require.True(t, e.free(t, "d-"+p))

		// Types of args in each mode.
		k = "typed-" + p
		res, err = l.DoStatement(ctx, rsIn(t, k, "p"), ledger.Statement{SQL: `INSERT INTO rs_effects (k, v) VALUES ($1, $2) RETURNING k, v, $3::numeric AS n`, Args: []any{k, int64(5), "1.50"}}, nil)
		require.NoError(t, err)
		require.Equal(t, `[{"k":"`+k+`","v":5,"n":1.50}]`, string(res.Body))

		// Many callers on one key, with and without waiting.
		for _, w := range []time.Duration{0, 5 * time.Second} {
			k := fmt.Sprintf("race-%s-%v", p, w)
			var wg sync.WaitGroup
			var oks, firsts atomic.Int32
			for range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := l.DoStatement(ctx, rsIn(t, k, "p"), rsInsert(k), &ledger.StatementOpts{Wait: w})
					if err == nil {
						oks.Add(1)
						if !res.Replayed {
							firsts.Add(1)
						}
					} else if !errors.Is(err, ledger.ErrInProgress) || w > 0 {
						t.Errorf("heard %v", err)
					}
				}()
			}
			wg.Wait()
			require.Equal(t, int32(1), firsts.Load())
			require.Equal(t, 1, e.rows(t, k))
		}
	})
}

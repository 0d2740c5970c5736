package activity_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	tactivity "go.temporal.io/sdk/activity"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/testsuite"
)

// An External activity that sends a fresh key instead of its downstream key passes a
// crash after its outcome was recorded (the retry replays), but not a crash after the
// provider acted and before the ledger recorded it, nor a lost answer: the check fails
// for it and passes for the activity that sends call.DownstreamKey.
func TestCheck_CatchesWrongDownstreamKey(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	for _, tc := range []struct {
		name  string
		key   func(activity.Call) string
		wrong bool
	}{
		{"payments.charge.right", func(c activity.Call) string { return string(c.DownstreamKey) }, false},
		{"payments.charge.wrong", func(activity.Call) string { return uuid.NewString() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prov := testsuite.NewProvider()
			charge := func(ctx context.Context, req chargeReq) (string, error) {
				return activity.External(ctx, req, func(ctx context.Context, call activity.Call, req chargeReq) (string, error) {
					id, _ := prov.Call(tc.key(call))
					return id, nil
				}, nil)
			}
			c := testsuite.Case[chargeReq]{Name: tc.name, Activity: charge, Request: chargeReq{OrderID: "o-1", Amount: 100}, Ledger: l, Provider: prov}
			reps, err := testsuite.RunCrashPoints(c)
			require.NoError(t, err)
			require.Len(t, reps, 4, "an External activity is crashed at every point it reaches (not before-commit)")
			byPoint := map[testsuite.CrashPoint]error{}
			effects := map[testsuite.CrashPoint]int{}
			for _, r := range reps {
				byPoint[r.Point], effects[r.Point] = r.Problem(), r.Effects
			}
			require.NoError(t, byPoint[testsuite.AfterEffect], "after the outcome was recorded the retry replays, whatever the key")
			if !tc.wrong {
				require.NoError(t, byPoint[testsuite.AfterCall])
				require.NoError(t, byPoint[testsuite.LostAnswer])
				testsuite.CheckCrashBeforeComplete(t, c)
				return
			}
			require.ErrorContains(t, byPoint[testsuite.AfterCall], "another idempotency key")
			require.ErrorContains(t, byPoint[testsuite.LostAnswer], "another idempotency key")
			require.Equal(t, 2, effects[testsuite.AfterCall], "the provider acted twice")
			require.Equal(t, 2, effects[testsuite.LostAnswer])
			ft := &fatalRecorder{TB: t}
			runFatal(func() { testsuite.CheckCrashBeforeComplete(ft, c) })
			require.Contains(t, ft.msg, "after-call", "CheckCrashBeforeComplete fails the wrong-key activity")
		})
	}
}

// The provider's key check: effects counted elsewhere look right, but the retry called
// the provider with another key.
func TestCheck_ProviderSeesAnotherKey(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	prov := testsuite.NewProvider()
	charge := func(ctx context.Context, req chargeReq) (string, error) {
		return activity.External(ctx, req, func(ctx context.Context, call activity.Call, req chargeReq) (string, error) {
			key := string(call.DownstreamKey)
			if call.Redrive {
				key += "-retry" // a "retry suffix": the provider cannot deduplicate
			}
			id, _ := prov.Call(key)
			return id, nil
		}, nil)
	}
	reps, err := testsuite.RunCrashPoints(testsuite.Case[chargeReq]{Name: "payments.charge", Activity: charge,
		Request: chargeReq{OrderID: "o-2", Amount: 1}, Ledger: l, Provider: prov,
		Effects: func(context.Context) (int, error) { return 0, nil }})
	require.NoError(t, err)
	require.ErrorContains(t, reps[1].Problem(), "another idempotency key")
}

// Activities that return only an error are guarded and checked as they are written.
func TestErrorOnlyActivities(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	reserve := func(ctx context.Context, req reserveReq) error {
		return activity.DoErr(ctx, req, func(ctx context.Context, tx pgx.Tx, _ activity.Call, req reserveReq) error {
			_, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3)`, req.OrderID, req.SKU, req.Qty)
			return err
		}, nil)
	}
	testsuite.CheckCrashBeforeComplete(t, testsuite.Case[reserveReq]{Name: "inventory.reserve", Activity: reserve,
		Request: reserveReq{OrderID: "o-err", SKU: "pen", Qty: 1}, Ledger: l,
		Effects: func(ctx context.Context) (int, error) { return countWhere(ctx, pool, "reservations", "o-err") }})

	prov := testsuite.NewProvider()
	notify := func(ctx context.Context, req chargeReq) error {
		return activity.ExternalErr(ctx, req, func(ctx context.Context, call activity.Call, req chargeReq) error {
			prov.Call(string(call.DownstreamKey))
			return nil
		}, nil)
	}
	testsuite.CheckCrashBeforeComplete(t, testsuite.Case[chargeReq]{Name: "notify.send", Activity: notify,
		Request: chargeReq{OrderID: "o-err"}, Ledger: l, Provider: prov})

	declined := func(ctx context.Context, req chargeReq) error {
		return activity.ExternalErr(ctx, req, func(context.Context, activity.Call, chargeReq) error {
			return activity.Definitive("card_declined", "declined")
		}, nil)
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(declined, tactivity.RegisterOptions{Name: "payments.decline"})
	env.ExecuteWorkflow(oneActivity, "payments.decline", chargeReq{OrderID: "o-dec"})
	require.ErrorContains(t, env.GetWorkflowError(), "card_declined")

	_, err := testsuite.RunCrashPoints(testsuite.Case[chargeReq]{Name: "x", Activity: func(context.Context, reserveReq) error { return nil },
		Ledger: l, Provider: prov})
	require.ErrorContains(t, err, "Case.Activity")
	require.Error(t, activity.DoErr[int](context.Background(), 1, nil, nil))
}

// fatalRecorder records a check's failure instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(f)
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

func (f *fatalRecorder) Helper() {}

// runFatal runs fn, stopping at a recorded Fatal.
func runFatal(fn func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(*fatalRecorder); !ok {
				panic(r)
			}
		}
	}()
	fn()
}

// A call that certainly had no effect releases the key: the retry calls afresh (no
// re-drive), and the error is a *NotAppliedError that tests can errors.As.
func TestExternal_NotAppliedReleasesTheKey(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	prov := testsuite.NewProvider()
	var seen []activity.Call
	var asNotApplied bool
	charge := func(ctx context.Context, req chargeReq) (string, error) {
		id, err := activity.External(ctx, req, func(ctx context.Context, call activity.Call, req chargeReq) (string, error) {
			seen = append(seen, call)
			if len(seen) == 1 {
				return "", activity.NotApplied(errors.New("rate limited before anything happened"))
			}
			id, _ := prov.Call(string(call.DownstreamKey))
			return id, nil
		}, nil)
		var na *ledger.NotAppliedError
		if errors.As(err, &na) {
			asNotApplied = true
		}
		return id, err
	}
	env := testsuite.NewWorkflowEnvironment(&testsuite.EnvConfig{Ledger: l})
	env.RegisterActivityWithOptions(charge, tactivity.RegisterOptions{Name: "payments.charge"})
	env.ExecuteWorkflow(oneActivity, "payments.charge", chargeReq{OrderID: "o-na", Amount: 5})
	require.NoError(t, env.GetWorkflowError())
	require.True(t, asNotApplied)
	require.Len(t, seen, 2)
	require.False(t, seen[1].Redrive, "a released key is claimed afresh, not re-driven")
	require.Equal(t, 1, seen[1].Attempt)
	require.Equal(t, 1, prov.Effects())
}

// A Do activity is also crashed before its effect and with its writes done but not
// committed: either way the retry writes once.
func TestCheck_DoActivityBeforeCommit(t *testing.T) {
	t.Parallel()
	l, pool := setup(t)
	reps, err := testsuite.RunCrashPoints(testsuite.Case[reserveReq]{Name: "inventory.reserve", Activity: reserveOrder,
		Request: reserveReq{OrderID: "o-bc", SKU: "pen", Qty: 1}, Ledger: l,
		Effects: func(ctx context.Context) (int, error) { return countWhere(ctx, pool, "reservations", "o-bc") }})
	require.NoError(t, err)
	points := map[testsuite.CrashPoint]int{}
	for _, r := range reps {
		require.NoError(t, r.Problem())
		points[r.Point] = r.Effects
	}
	require.Equal(t, map[testsuite.CrashPoint]int{testsuite.AfterEffect: 1, testsuite.BeforeEffect: 1, testsuite.BeforeCommit: 1}, points)
}

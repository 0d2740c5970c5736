package activity_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/sagarec"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
)

// recordEnv runs the saga's record activities against l, one environment per call, so
// that calls can race.
func recordEnv(l *ledger.Ledger) func(name string, arg any) (sagarec.Recorded, error) {
	return func(name string, arg any) (sagarec.Recorded, error) {
		var s ttestsuite.WorkflowTestSuite
		s.SetLogger(devenv.QuietLogger())
		env := s.NewTestActivityEnvironment()
		env.SetWorkerOptions(tworker.Options{BackgroundActivityContext: keys.WithTenant(activity.WithLedger(context.Background(), l), "acme")})
		activity.RegisterSaga(env)
		var r sagarec.Recorded
		v, err := env.ExecuteActivity(name, arg)
		if err == nil {
			err = v.Get(&r)
		}
		return r, err
	}
}

// A run's End (recording a success) and its Compensating (recording that the saga
// compensates) race: whichever comes first wins, and the other sees it. A success is
// never recorded beside a compensating record, and every answer agrees with what the
// ledger holds.
func TestSagaRecord_EndAndCompensatingExcludeEachOther(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	run := recordEnv(l)
	scope := keys.Scope{Tenant: "acme", Operation: saga.Operation}
	fp, err := keys.FingerprintJSON("order")
	require.NoError(t, err)
	for round := range 10 {
		req := sagarec.BeginRequest{Key: fmt.Sprintf("race-%d", round), Token: uuid.New(), Lease: time.Minute, Fingerprint: string(fp)}
		begun, err := run(sagarec.ActivityBegin, req)
		require.NoError(t, err)
		require.Equal(t, sagarec.Recorded{}, begun, "the run claims the key")
		const racers = 8
		answers := make([]sagarec.Recorded, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					answers[i], errs[i] = run(sagarec.ActivityEnd, sagarec.EndRequest{BeginRequest: req, Outcome: sagarec.Recorded{Ended: true, Result: []byte(`"done"`)}})
				} else {
					answers[i], errs[i] = run(sagarec.ActivityCompensating, sagarec.CompensatingRequest{BeginRequest: req,
						Compensating: sagarec.Compensating{ErrMessage: "the step failed", Steps: []string{"charge"}}})
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}

		rec, err := l.Get(context.Background(), scope, keys.Key(req.Key))
		require.NoError(t, err)
		markerKey, err := keys.Derive(keys.Key(req.Key), sagarec.CompensatingPurpose)
		require.NoError(t, err)
		_, err = l.Get(context.Background(), scope, markerKey)
		compensating := err == nil
		completed := rec.State == ledger.StateCompleted
		require.True(t, completed != compensating, "round %d: completed %v, compensating %v", round, completed, compensating)
		for i, a := range answers {
			if completed {
				require.True(t, a.Ended && a.ErrType == "" && a.Compensating == nil, "round %d, racer %d: %+v beside a recorded success", round, i, a)
			} else {
				require.True(t, !a.Ended && a.Compensating != nil, "round %d, racer %d: %+v beside a compensating record", round, i, a)
			}
		}
	}
}

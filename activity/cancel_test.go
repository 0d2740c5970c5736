package activity_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// An attempt waiting for another attempt's key gives up as soon as it is cancelled, and
// runs nothing.
func TestDo_WaitRespectsCancellation(t *testing.T) {
	t.Parallel()
	l, _ := setup(t)
	key, err := keys.Business("o-cancel", "reserve")
	require.NoError(t, err)
	req := reserveReq{OrderID: "o-cancel", SKU: "x", Qty: 1}
	fp, err := keys.FingerprintJSON(req)
	require.NoError(t, err)

	// Another attempt holds the key, in an open transaction, until the test ends.
	holding, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	go func() {
		_, _ = l.Do(context.Background(), ledger.Intent{Scope: keys.Scope{Tenant: "acme", Operation: "inventory.reserve"}, Key: key, Fingerprint: fp},
			func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
				close(holding)
				<-release
				return ledger.Response{}, nil
			}, &ledger.DoOpts{Mode: ledger.ModeClaimFirst}) // holds the key before fn runs
	}()
	<-holding

	bg, cancel := context.WithCancel(context.Background())
	var s ttestsuite.WorkflowTestSuite
	s.SetLogger(devenv.QuietLogger())
	env := s.NewTestActivityEnvironment()
	env.SetWorkerOptions(tworker.Options{BackgroundActivityContext: bg})
	ran := false
	waiter := func(ctx context.Context, req reserveReq) (reservation, error) {
		return activity.Do(ctx, req, func(ctx context.Context, tx pgx.Tx, _ activity.Call, req reserveReq) (reservation, error) {
			ran = true
			return reservation{}, nil
		}, &activity.Opts{Ledger: l, Tenant: "acme", Operation: "inventory.reserve", Key: key, Wait: time.Minute})
	}
	env.RegisterActivity(waiter)
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, err = env.ExecuteActivity(waiter, req)
	require.Error(t, err)
	require.Less(t, time.Since(start), 20*time.Second, "the wait stopped at the cancellation, not after the minute")
	require.False(t, ran)
}

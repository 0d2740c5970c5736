package activity_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	ttestsuite "go.temporal.io/sdk/testsuite"
	tworker "go.temporal.io/sdk/worker"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/internal/sagarec"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/shard"
)

// On a ledger over two shards, an activity's write and its record, and a saga's
// record, land on the shard of the tenant the activity carries.
func TestSharded_ActivityAndSagaRecordOnTheTenantsShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewSharded(t, pgtest.Migrator(ledger.Migrate),
		`CREATE TABLE reservations (id bigserial PRIMARY KEY, order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL)`)
	pools := []*pgxpool.Pool{s.A, s.B}
	r, err := shard.New([]shard.Shard{{Name: "a", Pool: s.A}, {Name: "b", Pool: s.B}},
		shard.Map(map[string]string{"acme": "a", "globex": "b"}, nil))
	require.NoError(t, err)
	l, err := ledger.NewSharded(r, &ledger.Config{Schema: s.Schema})
	require.NoError(t, err)

	envFor := func(tenant string) *ttestsuite.TestActivityEnvironment {
		var s ttestsuite.WorkflowTestSuite
		s.SetLogger(devenv.QuietLogger())
		env := s.NewTestActivityEnvironment()
		env.SetWorkerOptions(tworker.Options{BackgroundActivityContext: keys.WithTenant(activity.WithLedger(ctx, l), tenant)})
		env.RegisterActivity(reserveByOrder)
		activity.RegisterSaga(env)
		return env
	}
	count := func(p *pgxpool.Pool, table, where string, args ...any) int {
		var n int
		require.NoError(t, p.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE `+where, args...).Scan(&n))
		return n
	}
	for tenant, i := range map[string]int{"acme": 0, "globex": 1} {
		env := envFor(tenant)
		for range 2 { // the second is a retry: a replay
			_, err := env.ExecuteActivity(reserveByOrder, reserveReq{OrderID: "o-" + tenant, SKU: "sku", Qty: 1})
			require.NoError(t, err)
		}
		fp, err := keys.FingerprintJSON("order")
		require.NoError(t, err)
		req := sagarec.BeginRequest{Key: "saga-" + tenant, Token: uuid.New(), Lease: time.Minute, Fingerprint: string(fp)}
		_, err = env.ExecuteActivity(sagarec.ActivityBegin, req)
		require.NoError(t, err)
		_, err = env.ExecuteActivity(sagarec.ActivityCompensating, sagarec.CompensatingRequest{BeginRequest: req,
			Compensating: sagarec.Compensating{ErrMessage: "the step failed", Steps: []string{"reserve"}}})
		require.NoError(t, err)
		for j, p := range pools {
			want := 0
			if j == i {
				want = 1
			}
			require.Equal(t, want, count(p, "reservations", "order_id = $1", "o-"+tenant), "%s's reservation on shard %d", tenant, j)
			require.Equal(t, 2*want, count(p, "idempotency_records", "tenant = $1 AND operation = $2", tenant, saga.Operation),
				"%s's saga record and its compensating marker on shard %d", tenant, j)
		}
	}
}

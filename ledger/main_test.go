package ledger_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testBundle is what a test needs beside the ledger.
type testBundle struct {
	pool   *pgxpool.Pool
	schema string
	clock  *pgtest.Clock
}

// ordersDDL is the business table the tests write beside their records.
const ordersDDL = `CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, item text NOT NULL, amount bigint NOT NULL)`

// migrateLedger applies the ledger's migrations alone.
var migrateLedger = pgtest.Migrator(ledger.Migrate)

// setup migrates the ledger into a fresh schema with an "orders" business table and a
// stubbed clock that starts at the database's time.
func setup(t testing.TB, cfg *ledger.Config) (*ledger.Ledger, *testBundle) {
	t.Helper()
	pool, schema := pgtest.NewStore(t, migrateLedger, ordersDDL)
	clock := pgtest.NewClock(t, pool)
	l, err := ledger.New(pool, testConfig(cfg, schema, clock))
	require.NoError(t, err)
	return l, &testBundle{pool: pool, schema: schema, clock: clock}
}

// testConfig is cfg (nil: the defaults) on schema, with clock as the ledger's time
// unless cfg brings a clock of its own.
func testConfig(cfg *ledger.Config, schema string, clock *pgtest.Clock) *ledger.Config {
	c := ledger.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = schema
	if c.Test.NowFunc == nil {
		c.Test.NowFunc = clock.Now
	}
	return &c
}

// order is a business request.
type order struct {
	Item   string `json:"item"`
	Amount int64  `json:"amount"`
}

func intent(t testing.TB, tenant, key string, req any) ledger.Intent {
	t.Helper()
	fp, err := keys.FingerprintJSON(req)
	require.NoError(t, err)
	return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: "orders.create"}, Key: keys.Key(key), Fingerprint: fp}
}

// createOrder is the mutation under test: it inserts an order and returns its ID.
func createOrder(tenant string, o order) ledger.Func {
	return func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO orders (tenant, item, amount) VALUES ($1, $2, $3) RETURNING id",
			tenant, o.Item, o.Amount).Scan(&id); err != nil {
			return ledger.Response{}, err
		}
		body := []byte(`{"order_id":` + itoa(id) + `,"item":"` + o.Item + `"}`)
		return ledger.Response{Code: 201, Body: body, ResourceRef: "order/" + itoa(id)}, nil
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func countOrders(t testing.TB, pool *pgxpool.Pool, tenant string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM orders WHERE tenant = $1", tenant).Scan(&n))
	return n
}

func countRecords(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{schema, "idempotency_records"}.Sanitize()).Scan(&n))
	return n
}

// modes are the ways a call of Do claims its key.
var modes = []ledger.Mode{ledger.ModeClaimWithFirstStatement, ledger.ModeClaimFirst, ledger.ModeLookUpFirst, ledger.ModeOptimistic}

// modeName names a mode for a subtest: ClaimWithFirstStatement and so on.
func modeName(m ledger.Mode) string {
	var b strings.Builder
	for _, w := range strings.Split(m.String(), "_") {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// eachMode runs test in a parallel subtest per mode.
func eachMode(t *testing.T, test func(t *testing.T, mode ledger.Mode)) {
	for _, m := range modes {
		t.Run(modeName(m), func(t *testing.T) {
			t.Parallel()
			test(t, m)
		})
	}
}

// callsFnForTakenKey reports whether a mode calls fn before it knows the key is taken.
func callsFnForTakenKey(m ledger.Mode) bool {
	return m == ledger.ModeClaimWithFirstStatement || m == ledger.ModeOptimistic
}

// snapshotSQL takes a REPEATABLE READ or SERIALIZABLE transaction's snapshot where the
// records of the tenant acme live: on a single PostgreSQL any statement does; on Citus
// each node takes its snapshot at the transaction's first statement there, so the
// statement must reach the node holding acme's records.
func snapshotSQL() string {
	if pgtest.IsCitus() {
		return "SELECT count(*) FROM idempotency_records WHERE tenant = 'acme'"
	}
	return "SELECT count(*) FROM orders"
}

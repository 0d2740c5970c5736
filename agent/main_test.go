package agent_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type stubClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stubClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stubClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// bundle is what a test needs beside the guard.
type bundle struct {
	pool   *pgxpool.Pool
	schema string
	clock  *stubClock
	l      *ledger.Ledger
	// lcfg configures the ledgers of the bundle's guards, but for their schema and clock.
	lcfg ledger.Config
}

// setup migrates oncekit's tables into a fresh schema with an "effects" table that
// stands for what tools do, and returns a guard whose ledger and approvals share a
// stubbed clock.
func setup(t testing.TB, cfg *agent.Config) (*agent.Guard, *bundle) {
	t.Helper()
	return setupLedger(t, nil, cfg)
}

// setupLedger is setup with the guard's ledger configured by lcfg, but for its schema
// and clock.
func setupLedger(t testing.TB, lcfg *ledger.Config, cfg *agent.Config) (*agent.Guard, *bundle) {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, call text NOT NULL, dkey text UNIQUE, body text NOT NULL)`)
	require.NoError(t, err)
	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	b := &bundle{pool: pool, schema: schema, clock: &stubClock{now: dbNow}}
	if lcfg != nil {
		b.lcfg = *lcfg
	}
	var g *agent.Guard
	g, b.l = b.guard(t, pool, cfg)
	return g, b
}

// guard returns a guard on pool, on the bundle's schema and clock.
func (b *bundle) guard(t testing.TB, pool *pgxpool.Pool, cfg *agent.Config) (*agent.Guard, *ledger.Ledger) {
	t.Helper()
	lc := b.lcfg
	lc.Schema, lc.Test.NowFunc = b.schema, b.clock.Now
	l, err := ledger.New(pool, &lc)
	require.NoError(t, err)
	c := agent.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Test.NowFunc = b.clock.Now
	g, err := agent.New(l, &c)
	require.NoError(t, err)
	return g, l
}

// provider stands for a tool's provider: it records each effect in PostgreSQL, and
// one that accepts a key deduplicates by it, as a hosted email API does.
type provider struct {
	pool  *pgxpool.Pool
	calls atomic.Int64
}

func (p *provider) send(ctx context.Context, inv agent.Invocation, keyed bool) (json.RawMessage, error) {
	p.calls.Add(1)
	var id int64
	var err error
	if keyed {
		err = p.pool.QueryRow(ctx, `INSERT INTO effects (call, dkey, body) VALUES ($1, $2, $3)
			ON CONFLICT (dkey) DO UPDATE SET dkey = excluded.dkey RETURNING id`, string(inv.Call.Key), string(inv.DownstreamKey), string(inv.Args)).Scan(&id)
	} else {
		err = p.pool.QueryRow(ctx, `INSERT INTO effects (call, body) VALUES ($1, $2) RETURNING id`, string(inv.Call.Key), string(inv.Args)).Scan(&id)
	}
	if err != nil {
		return nil, ledger.NotApplied(err)
	}
	return json.RawMessage(`{"id":` + strconv.FormatInt(id, 10) + `}`), nil
}

// keyed is a ToolFunc against a provider that deduplicates by the downstream key.
func (p *provider) keyed(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
	return p.send(ctx, inv, true)
}

// plain is a ToolFunc against a provider that takes no key, as an SMTP server.
func (p *provider) plain(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
	return p.send(ctx, inv, false)
}

// local is a LocalFunc that writes through the call's transaction.
func (p *provider) local(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
	p.calls.Add(1)
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO effects (call, body) VALUES ($1, $2) RETURNING id`, string(inv.Call.Key), string(inv.Args)).Scan(&id); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"id":` + strconv.FormatInt(id, 10) + `}`), nil
}

func effects(t testing.TB, pool *pgxpool.Pool, ref agent.CallRef) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM effects WHERE call = $1", string(ref.Key)).Scan(&n))
	return n
}

var (
	emailAPI = agent.Tool{Name: "send_email", AcceptsKey: true}
	smtpSend = agent.Tool{Name: "smtp_send"}
	ticket   = agent.Tool{Name: "open_ticket"}
)

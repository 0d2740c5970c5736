package agent_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what a test needs beside the guard.
type bundle struct {
	pool  *pgxpool.Pool
	clock *pgtest.Clock
	l     *ledger.Ledger
}

// setup migrates oncekit's tables into a fresh schema with an "effects" table that
// stands for what tools do, and returns a guard whose ledger and approvals share a
// stubbed clock.
func setup(t testing.TB, cfg *agent.Config) (*agent.Guard, *bundle) {
	t.Helper()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up),
		`CREATE TABLE effects (id bigserial PRIMARY KEY, call text NOT NULL, dkey text UNIQUE, body text NOT NULL)`)
	clock := pgtest.NewClock(t, pool)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema, Test: ledger.TestConfig{NowFunc: clock.Now}})
	require.NoError(t, err)
	c := agent.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Test.NowFunc = clock.Now
	g, err := agent.New(l, &c)
	require.NoError(t, err)
	return g, &bundle{pool: pool, clock: clock, l: l}
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
		return nil, agent.NotApplied(err)
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

package mcpguard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/agent/mcpguard"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type refundIn struct {
	Charge string `json:"charge"`
	Amount int    `json:"amount"`
}

type refundOut struct {
	Refund string `json:"refund"`
}

// fixture is an MCP server with a guarded refund tool and a read-only lookup tool,
// served over streamable HTTP on loopback, and a client session of the SDK's own client.
type fixture struct {
	session *mcp.ClientSession
	// started and release pace the slow_refund tool: it says it started, then waits.
	started chan struct{}
	release chan struct{}
	pool    *pgxpool.Pool
	refunds atomic.Int64
	lookups atomic.Int64
}

func setup(t *testing.T, cfg *mcpguard.Config) *fixture {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE refunds (id bigserial PRIMARY KEY, charge text NOT NULL, amount int NOT NULL)`)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	ag, err := agent.New(l, nil)
	require.NoError(t, err)
	f := &fixture{pool: pool, started: make(chan struct{}, 1), release: make(chan struct{})}

	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "v1"}, nil)
	refund := &mcp.Tool{Name: "refund", Description: "Refunds a charge.", Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true)}}
	mcp.AddTool(server, refund, func(ctx context.Context, req *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, refundOut, error) {
		f.refunds.Add(1)
		var id int64
		if err := pool.QueryRow(ctx, "INSERT INTO refunds (charge, amount) VALUES ($1, $2) RETURNING id", in.Charge, in.Amount).Scan(&id); err != nil {
			return nil, refundOut{}, err
		}
		return nil, refundOut{Refund: "re_" + strconv.FormatInt(id, 10)}, nil
	})
	lookup := &mcp.Tool{Name: "lookup", Description: "Reads a charge.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	mcp.AddTool(server, lookup, func(ctx context.Context, req *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, refundOut, error) {
		f.lookups.Add(1)
		return nil, refundOut{Refund: "none"}, nil
	})
	slow := &mcp.Tool{Name: "slow_refund", Description: "Refunds a charge, slowly."}
	mcp.AddTool(server, slow, func(ctx context.Context, req *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, refundOut, error) {
		f.started <- struct{}{}
		<-f.release
		// The refund goes through even though the client gave up waiting for it.
		var id int64
		if err := pool.QueryRow(context.WithoutCancel(ctx), "INSERT INTO refunds (charge, amount) VALUES ($1, $2) RETURNING id", in.Charge, in.Amount).Scan(&id); err != nil {
			return nil, refundOut{}, err
		}
		return nil, refundOut{Refund: "re_" + strconv.FormatInt(id, 10)}, nil
	})
	g := mcpguard.New(ag, cfg)
	g.Declare(refund, lookup, slow)
	server.AddReceivingMiddleware(g.Middleware())

	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	f.session, err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.session.Close() })
	return f
}

func (f *fixture) call(t *testing.T, tool, key string, args any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if key != "" {
		p.Meta = mcp.Meta{mcpguard.MetaKey: key}
	}
	res, err := f.session.CallTool(context.Background(), p)
	require.NoError(t, err)
	return res
}

func text(r *mcp.CallToolResult) string {
	if len(r.Content) == 0 {
		return ""
	}
	if tc, ok := r.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

func (f *fixture) count(t *testing.T) int {
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM refunds").Scan(&n))
	return n
}

// A retried call with the same key gets the stored result through the SDK's client and
// server over streamable HTTP, and the tool runs once; other arguments under the key
// are refused with both argument sets.
func TestGuard_ReplaysRetriedCall(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	key := mcpguard.KeyFor("ticket-42", "3")
	first := f.call(t, "refund", key, refundIn{Charge: "ch_1", Amount: 500})
	require.False(t, first.IsError, text(first))
	require.Nil(t, first.Meta[mcpguard.MetaReplayed])
	again := f.call(t, "refund", key, map[string]any{"amount": 500, "charge": "ch_1"})
	require.False(t, again.IsError, text(again))
	require.Equal(t, true, again.Meta[mcpguard.MetaReplayed])
	require.Equal(t, text(first), text(again))
	require.Equal(t, first.StructuredContent, again.StructuredContent)
	require.EqualValues(t, 1, f.refunds.Load())
	require.Equal(t, 1, f.count(t))

	changed := f.call(t, "refund", key, refundIn{Charge: "ch_1", Amount: 5000})
	require.True(t, changed.IsError)
	require.Equal(t, "arguments-changed", changed.Meta[mcpguard.MetaOutcome])
	require.Contains(t, text(changed), `"amount":5000`)
	require.Contains(t, text(changed), `"amount":500,`)
	require.Equal(t, 1, f.count(t))

	other := f.call(t, "refund", mcpguard.KeyFor("ticket-42", "4"), refundIn{Charge: "ch_1", Amount: 5000})
	require.False(t, other.IsError, text(other))
	require.Equal(t, 2, f.count(t))
}

// A guarded call without a key is refused by default and passed through when the server
// says so; a read-only tool runs without the ledger only when its hints are trusted.
func TestGuard_WithoutKey(t *testing.T) {
	t.Parallel()
	t.Run("Refuse", func(t *testing.T) {
		t.Parallel()
		f := setup(t, nil)
		r := f.call(t, "refund", "", refundIn{Charge: "ch_1", Amount: 500})
		require.True(t, r.IsError)
		require.Equal(t, "key-required", r.Meta[mcpguard.MetaOutcome])
		require.Contains(t, text(r), mcpguard.MetaKey)
		require.Zero(t, f.refunds.Load())
		r = f.call(t, "lookup", "", refundIn{Charge: "ch_1"})
		require.True(t, r.IsError, "hints are not trusted unless the configuration says so")
	})
	t.Run("PassThrough", func(t *testing.T) {
		t.Parallel()
		f := setup(t, &mcpguard.Config{WithoutKey: mcpguard.PassThrough})
		for range 2 {
			r := f.call(t, "refund", "", refundIn{Charge: "ch_1", Amount: 500})
			require.False(t, r.IsError, text(r))
		}
		require.Equal(t, 2, f.count(t))
	})
	t.Run("TrustedReadOnly", func(t *testing.T) {
		t.Parallel()
		f := setup(t, &mcpguard.Config{TrustReadOnlyHints: true})
		for range 2 {
			r := f.call(t, "lookup", "", refundIn{Charge: "ch_1"})
			require.False(t, r.IsError, text(r))
		}
		require.EqualValues(t, 2, f.lookups.Load())
		r := f.call(t, "refund", "", refundIn{Charge: "ch_1", Amount: 500})
		require.True(t, r.IsError, "a destructive tool is guarded whatever the configuration trusts")
	})
}

// A client that gave up on a call whose tool went on to act, as when its answer was lost
// on the way back, retries with the same key and gets the stored
// result; the refund happened once.
func TestGuard_LostAnswerReplays(t *testing.T) {
	t.Parallel()
	f := setup(t, &mcpguard.Config{Wait: 30 * time.Second})
	key := mcpguard.KeyFor("ticket-7", "1")
	ctx, cancel := context.WithCancel(context.Background())
	lost := make(chan error, 1)
	go func() {
		_, err := f.session.CallTool(ctx, &mcp.CallToolParams{Name: "slow_refund", Arguments: refundIn{Charge: "ch_7", Amount: 700},
			Meta: mcp.Meta{mcpguard.MetaKey: key}})
		lost <- err
	}()
	select {
	case <-f.started:
	case <-time.After(time.Minute):
		t.Fatal("the tool did not start")
	}
	cancel()
	select {
	case err := <-lost:
		require.Error(t, err, "the client gave up")
	case <-time.After(time.Minute):
		t.Fatal("the client did not give up")
	}
	close(f.release)

	again := f.call(t, "slow_refund", key, refundIn{Charge: "ch_7", Amount: 700})
	require.False(t, again.IsError, text(again))
	require.Equal(t, true, again.Meta[mcpguard.MetaReplayed])
	require.Contains(t, text(again), "re_")
	require.Equal(t, 1, f.count(t))
}

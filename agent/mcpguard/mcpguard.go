// Package mcpguard makes the tools of an MCP server built on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk) run once per intent: a tool call carries a
// key chosen by the client in the request's _meta, under [MetaKey], and a retried call
// with the same key gets the stored result instead of a second run. It is a module of
// its own, so that the MCP SDK is a dependency of this package's users alone.
//
// # The key
//
// The key names the call's place in the client's work, never its arguments: a client
// derives it from its task and the call's step, as [KeyFor] does ("task/step"), and
// sends the same key on every retry of that call. The server scopes it by tenant and
// tool. A retry with the same key and other arguments, as when the model changed its
// mind, is refused with a tool error that shows both argument sets.
//
// # Which calls are guarded
//
// Every tool is guarded unless its annotations say it only reads (readOnlyHint) and
// [Config].TrustReadOnlyHints is set; a tool whose destructiveHint is set is guarded
// whatever its other hints say. A guarded call without a key is refused, or passed
// through unguarded when [Config].WithoutKey is [PassThrough].
//
// A call whose handler failed with a Go error, or whose server died before the result
// was recorded, may have acted: its retries get a tool error that says the call is
// uncertain, and an operator settles it with agent.Guard.Resolve.
package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

// MetaKey is the _meta field of a tools/call request that carries the call's
// idempotency key.
const MetaKey = "oncekit/idempotency-key"

// MetaReplayed is the _meta field set to true on a result that was replayed from the
// ledger; MetaOutcome names why a guarded call was refused ("arguments-changed",
// "uncertain", "in-progress", "key-required").
const (
	MetaReplayed = "oncekit/replayed"
	MetaOutcome  = "oncekit/outcome"
)

// TenantDefault is the tenant of every call when [Config].TenantFunc is nil.
const TenantDefault = "default"

// StepDefault is the step under which a call is recorded in the task its key names.
const StepDefault = "mcp"

// KeyFor returns the key a client sends for the call at step of its task.
func KeyFor(task, step string) string { return task + "/" + step }

// Keyless is what a guarded tool's call without a key gets.
type Keyless int

const (
	// Refuse answers a call without a key with a tool error: the default.
	Refuse Keyless = iota
	// PassThrough runs a call without a key unguarded.
	PassThrough
)

// Config configures a [Guard]. A nil *Config means all defaults.
type Config struct {
	// TenantFunc returns the tenant of a call, such as from the session's
	// authentication. Defaults to [TenantDefault] for every call.
	TenantFunc func(ctx context.Context, req *mcp.CallToolRequest) (string, error)
	// WithoutKey is what a guarded call without a key gets. Defaults to [Refuse].
	WithoutKey Keyless
	// TrustReadOnlyHints lets a tool annotated read-only, and not destructive, run
	// without the ledger. Defaults to false.
	TrustReadOnlyHints bool
	// Wait bounds how long a call waits for a duplicate in flight before it is answered
	// "in progress". Defaults to 0: answer at once.
	Wait time.Duration
}

// Guard guards the tool calls of an MCP server. It is safe for concurrent use.
type Guard struct {
	g   *agent.Guard
	cfg Config

	mu    sync.RWMutex
	hints map[string]*mcp.ToolAnnotations
}

// New returns a guard on the agent guard g.
func New(g *agent.Guard, cfg *Config) *Guard {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	return &Guard{g: g, cfg: c, hints: map[string]*mcp.ToolAnnotations{}}
}

// Declare tells the guard the annotations of tools, the same *mcp.Tool values given to
// the server's AddTool. A tool not declared is taken as MCP's defaults describe it:
// not read-only, destructive.
func (g *Guard) Declare(tools ...*mcp.Tool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range tools {
		g.hints[t.Name] = t.Annotations
	}
}

// Middleware returns the server middleware that guards tools/call; add it with the
// server's AddReceivingMiddleware.
func (g *Guard) Middleware() mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if method != "tools/call" || !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			return g.call(ctx, call, func(ctx context.Context) (mcp.Result, error) { return next(ctx, method, req) })
		}
	}
}

func (g *Guard) tool(name string) agent.Tool {
	g.mu.RLock()
	a := g.hints[name]
	g.mu.RUnlock()
	t := agent.Tool{Name: name, Hints: agent.Hints{Destructive: true}}
	if a != nil {
		t.Hints = agent.Hints{ReadOnly: a.ReadOnlyHint, Idempotent: a.IdempotentHint,
			Destructive: a.DestructiveHint != nil && *a.DestructiveHint}
	}
	return t
}

func (g *Guard) guarded(t agent.Tool) bool {
	return !(g.cfg.TrustReadOnlyHints && t.Hints.ReadOnly && !t.Hints.Destructive)
}

func (g *Guard) call(ctx context.Context, req *mcp.CallToolRequest, next func(context.Context) (mcp.Result, error)) (mcp.Result, error) {
	tool := g.tool(req.Params.Name)
	if !g.guarded(tool) {
		return next(ctx)
	}
	key, _ := req.Params.Meta[MetaKey].(string)
	if key == "" {
		if g.cfg.WithoutKey == PassThrough {
			return next(ctx)
		}
		return refusal("key-required", fmt.Sprintf("tool %q runs once per intent: send a key in _meta[%q], derived from your task and step", tool.Name, MetaKey)), nil
	}
	tenant := TenantDefault
	if g.cfg.TenantFunc != nil {
		var err error
		if tenant, err = g.cfg.TenantFunc(ctx, req); err != nil {
			return nil, err
		}
	}
	args := req.Params.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	task := g.g.Task(tenant, key)
	res, err := task.Call(ctx, StepDefault, tool, args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
		out, err := next(context.WithValue(ctx, invocationKey{}, inv))
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}, &agent.CallOpts{Wait: g.cfg.Wait})
	var (
		changed *agent.ArgumentsChangedError
		unc     *agent.UncertainError
	)
	switch {
	case errors.As(err, &changed):
		r := refusal("arguments-changed", changed.Error())
		r.Meta["oncekit/stored-arguments"] = changed.Stored
		return r, nil
	case errors.As(err, &unc):
		return refusal("uncertain", unc.Error()), nil
	case errors.Is(err, agent.ErrRejected), errors.Is(err, agent.ErrApprovalPending):
		return refusal("not-approved", err.Error()), nil
	case errors.Is(err, ledger.ErrInProgress):
		return refusal("in-progress", err.Error()), nil
	case err != nil:
		return nil, err
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(res.Output, &out); err != nil {
		return nil, fmt.Errorf("oncekit/mcpguard: decode the stored result of %s: %w", res.Call, err)
	}
	if res.Replayed {
		if out.Meta == nil {
			out.Meta = mcp.Meta{}
		}
		out.Meta[MetaReplayed] = true
	}
	return &out, nil
}

func refusal(outcome, text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}},
		Meta: mcp.Meta{MetaOutcome: outcome}}
}

type invocationKey struct{}

// InvocationFrom returns the guarded call a tool handler runs in: its key and the
// downstream key to send to a provider that deduplicates by one.
func InvocationFrom(ctx context.Context) (agent.Invocation, bool) {
	inv, ok := ctx.Value(invocationKey{}).(agent.Invocation)
	return inv, ok
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/ledger"
)

const agentSchema = "oncekit_bench_agent"

// agentBench compares an agent's guarded tool call (agent.Task.Call) with the same
// call unguarded, in the same rounds. The tool posts to a local email API that takes an
// Idempotency-Key and keeps each email in PostgreSQL, as a hosted provider keeps it in
// its own database; each call is a new task, so every guarded call is a first run.
type agentBench struct {
	url         string
	rounds      int
	opsPerRound int
}

func (b agentBench) run(ctx context.Context, out io.Writer) error {
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }
	pool, err := freshSchema(ctx, b.url, agentSchema, `CREATE TABLE emails (id bigserial PRIMARY KEY, idem_key text UNIQUE NOT NULL, body text NOT NULL)`)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: agentSchema})
	if err != nil {
		return err
	}
	g, err := agent.New(l, nil)
	if err != nil {
		return err
	}
	store := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var id int64
		err := pool.QueryRow(r.Context(), `INSERT INTO emails (idem_key, body) VALUES ($1, $2)
			ON CONFLICT (idem_key) DO UPDATE SET idem_key = excluded.idem_key RETURNING id`, r.Header.Get("Idempotency-Key"), body).Scan(&id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	api := httptest.NewServer(store)
	defer api.Close()
	// The same API behind a network: it answers remoteDelay later, as a provider across
	// the internet does, so that the guard's two commits are weighed against such a call.
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(remoteDelay)
		store(w, r)
	}))
	defer remote.Close()
	client := api.Client()
	args := json.RawMessage(`{"to":"ann@example.com","subject":"Your refund","body":"It is on its way."}`)
	sendTo := func(ctx context.Context, base, key string) (json.RawMessage, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/emails", bytes.NewReader(args))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("email API: status %d", resp.StatusCode)
		}
		return out, err
	}
	tool := agent.Tool{Name: "send_email", AcceptsKey: true}
	pair := func(base string) []scenario {
		return []scenario{
			{"bare", func(ctx context.Context, _ int) error {
				_, err := sendTo(ctx, base, uuid.NewString())
				return err
			}},
			{"tool", func(ctx context.Context, _ int) error {
				task := g.Task("bench", uuid.NewString())
				_, err := task.Call(ctx, "1", tool, args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
					return sendTo(ctx, base, string(inv.DownstreamKey))
				}, nil)
				return err
			}},
		}
	}
	lat, err := interleave(ctx, b.rounds, b.opsPerRound, 1, pair(api.URL))
	if err != nil {
		return err
	}
	emit("agent.bare_us", lat["bare"])
	emit("agent.tool_us", lat["tool"])
	emit("agent.tool_vs_bare", lat["tool"]/lat["bare"])
	// One call of each per round: each waits remoteDelay.
	lat, err = interleave(ctx, b.rounds, 1, 1, pair(remote.URL))
	if err != nil {
		return err
	}
	emit("agent.remote_tool_vs_bare", lat["tool"]/lat["bare"])
	return nil
}

// remoteDelay is how long the remote email API takes to answer.
const remoteDelay = 50 * time.Millisecond

package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/agent"
	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/internal/history"
	"github.com/oncekit/oncekit/ledger"
)

// histTools are the three kinds of tool, one per step: an API with a downstream key,
// one without (SMTP), and a database write.
var histTools = []agent.Tool{
	{Name: "email_api", AcceptsKey: true},
	{Name: "smtp"},
	{Name: "note"},
}

const histAgentLease = 10 * time.Second

// TestHistoryAgent runs agents on a few tasks at once: tasks claimed and taken over,
// calls delivered many times, answers lost, agents crashed after tool effects, models
// that change their minds, and a clock that moves leases past their end. Then it checks
// the whole history: each call's effect committed at most once, with the arguments of
// every call that returned its output; a tool without a key started at most once per
// call; every output handed back for a call is the same.
func TestHistoryAgent(t *testing.T) {
	run := history.Start(t, "./agent", 3*time.Second)
	g, b := setup(t, &agent.Config{CallLease: histAgentLease, TaskLease: histAgentLease})
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE hist_effects (id bigserial PRIMARY KEY, call_key text NOT NULL, dkey text UNIQUE, args text NOT NULL)`)
	require.NoError(t, err)
	log := history.NewLog()
	begin := time.Now()

	effect := func(ctx context.Context, q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, client int, inv agent.Invocation, keyed bool) (json.RawMessage, error) {
		log.Add(history.Event{Client: client, Kind: "start", Op: inv.Call.Tool, Key: string(inv.Call.Key), Detail: string(inv.Args) + " dkey " + string(inv.DownstreamKey)})
		var dkey *string
		if keyed {
			k := string(inv.DownstreamKey)
			dkey = &k
		}
		var id int64
		err := q.QueryRow(ctx, `INSERT INTO hist_effects (call_key, dkey, args) VALUES ($1, $2, $3)
			ON CONFLICT (dkey) DO UPDATE SET dkey = excluded.dkey RETURNING id`, string(inv.Call.Key), dkey, string(inv.Args)).Scan(&id)
		if err != nil {
			return nil, ledger.NotApplied(err)
		}
		out := json.RawMessage(`{"effect":` + strconv.FormatInt(id, 10) + `}`)
		log.Add(history.Event{Client: client, Kind: "effect", Op: inv.Call.Tool, Key: string(inv.Call.Key), Detail: string(out)})
		return out, nil
	}

	step := func(client int, rng *rand.Rand) {
		// Six tasks at a time, new ones every quarter second, so a long run keeps making
		// first calls rather than replaying a few.
		taskID := fmt.Sprintf("task-%d-%d", time.Since(begin)/(250*time.Millisecond), rng.IntN(6))
		var task *agent.Task
		if rng.IntN(2) == 0 {
			var err error
			task, err = g.ClaimTask(ctx, "acme", taskID, nil)
			if err != nil {
				return // held by another agent, or finished
			}
		} else {
			task = g.Task("acme", taskID)
		}
		s := rng.IntN(len(histTools))
		tool := histTools[s]
		args := json.RawMessage(`{"to":"ann"}`)
		if rng.IntN(5) == 0 {
			args = json.RawMessage(`{"to":"bob"}`) // the model changed its mind
		}
		fault := faultpoint.Fault(rng.IntN(3))
		if rng.IntN(2) == 0 {
			fault = faultpoint.None
		}
		fctx := faultpoint.With(ctx, func(context.Context, faultpoint.Point, any, error) faultpoint.Fault { return fault })
		ref, _ := g.Ref("acme", taskID, strconv.Itoa(s+1), tool.Name)
		log.Add(history.Event{Client: client, Kind: "call", Op: tool.Name, Key: string(ref.Key), Detail: fmt.Sprintf("%s fault %d claimed %v", args, fault, task.Attempt > 0)})
		var res agent.Result
		var err error
		if s == 2 {
			res, err = task.CallTx(fctx, strconv.Itoa(s+1), tool, args, func(ctx context.Context, tx pgx.Tx, inv agent.Invocation) (json.RawMessage, error) {
				return effect(ctx, tx, client, inv, false)
			}, &agent.CallOpts{Wait: 50 * time.Millisecond})
		} else {
			res, err = task.Call(fctx, strconv.Itoa(s+1), tool, args, func(ctx context.Context, inv agent.Invocation) (json.RawMessage, error) {
				return effect(ctx, b.pool, client, inv, tool.AcceptsKey)
			}, &agent.CallOpts{Wait: 50 * time.Millisecond})
		}
		detail := "ok " + string(res.Output)
		if res.Replayed {
			detail = "replayed " + string(res.Output)
		}
		if err != nil {
			detail = "error " + err.Error()
		}
		log.Add(history.Event{Client: client, Kind: "return", Op: tool.Name, Key: string(ref.Key), Detail: string(args) + " " + detail})
		if err == nil {
			log.Add(history.Event{Client: client, Kind: "output", Op: tool.Name, Key: string(ref.Key), Detail: string(args) + " " + string(res.Output)})
		}
		switch {
		case errors.Is(err, faultpoint.ErrCrashed):
			b.clock.Advance(histAgentLease + time.Second) // the dead agent's leases run out
		case task.Attempt > 0 && rng.IntN(4) == 0:
			_ = task.Finish(ctx, nil)
		case task.Attempt > 0:
			_ = task.Release(ctx)
		}
	}

	deadline := begin.Add(run.Duration)
	var clients sync.WaitGroup
	for i := range 8 {
		clients.Go(func() {
			rng := run.Rand(i)
			for time.Now().Before(deadline) {
				step(i, rng)
			}
		})
	}
	clients.Wait()

	// The checks, over the history and the effects committed in PostgreSQL.
	var vs []history.Violation
	rows, err := b.pool.Query(ctx, `SELECT call_key, count(*), min(args), max(args) FROM hist_effects GROUP BY call_key`)
	require.NoError(t, err)
	committed := map[string]string{}
	for rows.Next() {
		var key, minArgs, maxArgs string
		var n int
		require.NoError(t, rows.Scan(&key, &n, &minArgs, &maxArgs))
		committed[key] = minArgs
		if n > 1 || minArgs != maxArgs {
			vs = append(vs, history.Violation{Check: "one effect per call", Key: key,
				What: fmt.Sprintf("%d effects committed (arguments %s … %s)", n, minArgs, maxArgs), Events: log.Of(key)})
		}
	}
	require.NoError(t, rows.Err())
	starts, outputs := map[string]int{}, map[string]string{}
	for _, e := range log.Events() {
		switch {
		case e.Kind == "start" && e.Op == "smtp":
			if starts[e.Key]++; starts[e.Key] == 2 {
				vs = append(vs, history.Violation{Check: "a tool without a key starts once", Key: e.Key, What: "started twice", Events: log.Of(e.Key)})
			}
		case e.Kind == "output":
			var args, out string
			_, _ = fmt.Sscanf(e.Detail, "%s %s", &args, &out)
			if prev, ok := outputs[e.Key]; ok && prev != out {
				vs = append(vs, history.Violation{Check: "the same output on every replay", Key: e.Key, What: prev + " then " + out, Events: log.Of(e.Key)})
			}
			outputs[e.Key] = out
			if c, ok := committed[e.Key]; ok && c != args {
				vs = append(vs, history.Violation{Check: "only the first arguments are answered", Key: e.Key,
					What: "a call with " + args + " got the output of the effect of " + c, Events: log.Of(e.Key)})
			}
		}
	}
	history.Report(t, vs, 40)
	t.Logf("history: %d events, %d calls with effects, seed %d", log.Len(), len(committed), run.Seed)
	log.DumpOnFailure(t)
}

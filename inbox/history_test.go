package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/faultproxy"
	"github.com/oncekit/oncekit/internal/history"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

const (
	inboxHistClients     = 12
	inboxHistSubscribers = 3
	inboxHistMessages    = 40
)

// icall is one Handle call, and what became of it.
type icall struct {
	id                  int64
	client              int
	subscriber, message string
	kind                string // ok, fail, reject, slow
	inbox               string
	calls               atomic.Int32 // handler calls
	res                 inbox.Result
	err                 error
	seq                 int
}

// TestHistoryInbox runs many clients that deliver a small set of messages to
// inbox.Handle, in both modes and every exec mode, through a proxy that cuts, delays and
// half-closes their connections and loses the answers to their COMMITs, while backends
// are terminated. Each handler writes an effect row named after its call. Then: a
// message is handled at most once per subscriber; the handler's writes commit with the
// record (a processed record has one effect, a rejected one none); a plain error means
// nothing committed; what a call reports is what committed.
func TestHistoryInbox(t *testing.T) {
	ctx := context.Background()
	run := history.Start(t, "./inbox", 5*time.Second)
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up),
		`CREATE TABLE effects (call_id bigint PRIMARY KEY, subscriber text NOT NULL, message text NOT NULL)`)
	log := history.NewLog()

	proxy := faultproxy.Start(t, pgtest.URL(t), faultproxy.Plan{Seed: run.Seed, Cut: 0.003, CutAnswer: 0.002, HalfClose: 0.002,
		Delay: 0.02, CommitLost: 0.04, CommitFatal: 0.04,
		FaultFunc: func(kind string, conn int, detail string) {
			if kind != faultproxy.Delay {
				log.Add(history.Event{Client: -1, Kind: "fault", Op: "tcp " + kind, Detail: fmt.Sprintf("conn %d %s", conn, detail)})
			}
		}})

	inboxes := map[string]*inbox.Inbox{}
	var names []string
	for mname, mode := range map[string]inbox.Mode{"first": inbox.ModeRecordFirst, "withstmt": inbox.ModeRecordWithFirstStatement} {
		for _, exec := range pgtest.ExecModes {
			p := pgtest.Pool(t, schema, func(c *pgxpool.Config) {
				proxy.Route(&c.ConnConfig.Config)
				c.MaxConns = 3
				c.ConnConfig.DefaultQueryExecMode = exec
				c.ConnConfig.RuntimeParams["application_name"] = "oncekit-inbox-history"
				c.ConnConfig.ConnectTimeout = 2 * time.Second
			})
			ib, err := inbox.New(p, &inbox.Config{Schema: schema, Mode: mode})
			require.NoError(t, err)
			name := mname + "/" + exec.String()
			inboxes[name] = ib
			names = append(names, name)
		}
	}
	slices.Sort(names)

	var (
		mu     sync.Mutex
		calls  []*icall
		nextID atomic.Int64
	)
	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Go(func() { // terminate a backend now and then
		r := run.Rand(1000)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(100+r.IntN(400)) * time.Millisecond):
			}
			var pid int32
			if pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'oncekit-inbox-history'
				AND state <> 'idle' ORDER BY random() LIMIT 1`).Scan(&pid) == nil {
				if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid); err == nil {
					log.Add(history.Event{Client: -1, Kind: "fault", Op: "terminate", Detail: strconv.Itoa(int(pid))})
				}
			}
		}
	})
	deadline := time.Now().Add(run.Duration)
	var clients sync.WaitGroup
	for i := range inboxHistClients {
		clients.Go(func() {
			r := run.Rand(i)
			for time.Now().Before(deadline) {
				// The messages move on every few hundred calls, so that a long run keeps
				// delivering new messages beside redeliveries.
				id := nextID.Add(1)
				gen := int(id / (5 * inboxHistMessages))
				c := &icall{id: id, client: i, subscriber: "s" + strconv.Itoa(r.IntN(inboxHistSubscribers)),
					message: "m" + strconv.Itoa(gen*inboxHistMessages+r.IntN(inboxHistMessages)), inbox: names[r.IntN(len(names))]}
				c.kind = []string{"ok", "ok", "ok", "slow", "fail", "reject"}[r.IntN(6)]
				deliver(ctx, c, inboxes[c.inbox], log, r)
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		})
	}
	clients.Wait()
	close(stop)
	faults.Wait()
	proxy.SetEnabled(false)
	checkInboxHistory(t, pool, log, calls)
	t.Logf("history: %d calls, %d events, TCP faults: commit-lost %d, commit-fatal %d, cut %d; seed %d", len(calls), log.Len(),
		proxy.Count(faultproxy.CommitLost), proxy.Count(faultproxy.CommitFatal), proxy.Count(faultproxy.Cut), run.Seed)
	log.DumpOnFailure(t)
}

// deliver runs one Handle call whose handler writes the call's effect row.
func deliver(ctx context.Context, c *icall, ib *inbox.Inbox, log *history.Log, r *rand.Rand) {
	slow := time.Duration(r.IntN(30)) * time.Millisecond
	if r.IntN(10) == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(5+r.IntN(50))*time.Millisecond)
		defer cancel()
	}
	log.Add(history.Event{Client: c.client, Kind: "call", Op: "Handle", Key: c.subscriber + "/" + c.message,
		Detail: fmt.Sprintf("id=%d %s %s", c.id, c.kind, c.inbox)})
	c.res, c.err = ib.Handle(ctx, c.subscriber, c.message, func(ctx context.Context, tx pgx.Tx) error {
		c.calls.Add(1)
		if c.kind == "slow" {
			time.Sleep(slow)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, c.id, c.subscriber, c.message); err != nil {
			return err
		}
		switch c.kind {
		case "fail":
			return errors.New("the handler fails")
		case "reject":
			return ledger.Definitive("refused", "call "+strconv.FormatInt(c.id, 10))
		}
		return nil
	})
	c.seq = log.Add(history.Event{Client: c.client, Kind: "return", Op: "Handle", Key: c.subscriber + "/" + c.message,
		Detail: fmt.Sprintf("id=%d duplicate=%v rejected=%v err=%v", c.id, c.res.Duplicate, c.res.Rejected, c.err)})
}

func checkInboxHistory(t *testing.T, pool *pgxpool.Pool, log *history.Log, calls []*icall) {
	ctx := context.Background()
	effects := map[int64]string{} // call -> subscriber/message
	perMsg := map[string][]int64{}
	rows, err := pool.Query(ctx, `SELECT call_id, subscriber || '/' || message FROM effects`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var key string
		require.NoError(t, rows.Scan(&id, &key))
		effects[id] = key
		perMsg[key] = append(perMsg[key], id)
	}
	require.NoError(t, rows.Err())
	type record struct{ state, err string }
	records := map[string]record{}
	rows, err = pool.Query(ctx, `SELECT subscriber || '/' || message_id, state, coalesce(error, '') FROM inbox_messages`)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var rec record
		require.NoError(t, rows.Scan(&key, &rec.state, &rec.err))
		records[key] = rec
	}
	require.NoError(t, rows.Err())
	// rejectedBy is the call a rejected record names.
	rejectedBy := func(rec record) int64 {
		i := strings.LastIndex(rec.err, "call ")
		if i < 0 {
			return 0
		}
		id, _ := strconv.ParseInt(rec.err[i+5:], 10, 64)
		return id
	}

	var vs []history.Violation
	// bad reports a violation with the events of key up to seq, the call that shows
	// it (or all of them, for seq -1).
	badAt := func(check, key string, seq int, what string) {
		var events []history.Event
		for _, e := range log.Of(key) {
			if seq < 0 || e.Seq <= seq {
				events = append(events, e)
			}
		}
		vs = append(vs, history.Violation{Check: check, Key: key, What: what, Events: events})
	}
	bad := func(check, key, what string) { badAt(check, key, -1, what) }
	for key, ids := range perMsg {
		if len(ids) > 1 {
			bad("handled at most once per subscriber and message", key, fmt.Sprintf("the effects of calls %v committed", ids))
		}
	}
	keys := map[string]bool{}
	for k := range records {
		keys[k] = true
	}
	for k := range perMsg {
		keys[k] = true
	}
	for key := range keys {
		rec, ok := records[key]
		n := len(perMsg[key])
		switch {
		case !ok && n > 0:
			bad("the handler's writes commit with the record", key, fmt.Sprintf("%d effects committed without a record", n))
		case ok && rec.state == "processed" && n != 1:
			bad("the handler's writes commit with the record", key, fmt.Sprintf("a processed record with %d effects", n))
		case ok && rec.state == "rejected" && n != 0:
			bad("the handler's writes commit with the record", key, fmt.Sprintf("a rejected record with %d effects", n))
		}
	}
	kinds := map[string]int{}
	for _, c := range calls {
		key := c.subscriber + "/" + c.message
		_, effect := effects[c.id]
		rec := records[key]
		unknown := errors.Is(c.err, ledger.ErrOutcomeUnknown)
		var derr *ledger.DefinitiveError
		rejectedHere := rec.state == "rejected" && rejectedBy(rec) == c.id
		class := "ok"
		switch {
		case unknown:
			class = "unknown"
		case c.err != nil && c.res.Rejected && errors.As(c.err, &derr):
			class = "rejected"
		case c.err != nil:
			class = "error"
		case c.res.Duplicate:
			class = "duplicate"
		}
		kinds[class]++
		if n := c.calls.Load(); n > 1 {
			badAt("the handler runs at most once per call", key, c.seq, fmt.Sprintf("call %d: the handler ran %d times", c.id, n))
		}
		switch class {
		case "error":
			if effect || rejectedHere {
				badAt("a plain error means nothing committed", key, c.seq, fmt.Sprintf("call %d returned %v, yet its effect or rejection committed", c.id, c.err))
			}
		case "ok":
			if !effect {
				badAt("what the client sees is what was committed", key, c.seq, fmt.Sprintf("call %d (%s) reported the message handled; its effect did not commit", c.id, c.kind))
			}
		case "duplicate":
			if effect || rejectedHere {
				badAt("what the client sees is what was committed", key, c.seq, fmt.Sprintf("call %d reported a duplicate; its own writes committed", c.id))
			}
		case "rejected":
			if !c.res.Duplicate && !rejectedHere {
				badAt("what the client sees is what was committed", key, c.seq, fmt.Sprintf("call %d reported a rejection; the record is %q", c.id, rec.state))
			}
		}
	}
	t.Logf("history: outcomes %v", kinds)
	if history.Report(t, vs, 40) == 0 {
		t.Logf("history: every check held")
	}
}

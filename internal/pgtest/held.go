package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// heldStandby is the synchronous standby the test cluster waits for and that never
// connects: a session that sets synchronous_commit=on has each commit made durable and
// then held, before its answer is sent, until the standby confirms it, which it never
// does. Every other session runs with the cluster's synchronous_commit=off and waits for
// nothing.
const heldStandby = "oncekit_held"

// Held is a pool whose commits PostgreSQL makes durable and then holds before it
// answers, and the means to end such a commit's connection while it is held: the
// client then hears a FATAL error for a transaction that committed, which is what a
// server shut down, a failover or a proxy cutting the connection can do to a client
// between COMMIT and its answer.
type Held struct {
	// Pool is the held pool.
	Pool *pgxpool.Pool
	app  string
	url  string

	mu sync.Mutex
	// seen are the held commits already found, by backend and start: a commit whose
	// client went away without cancelling it stays held, and is not found again.
	seen []heldCommit
}

type heldCommit struct {
	pid     int
	started time.Time
}

// NewHeld opens a held pool on schema. It skips the test when the tests run against
// DATABASE_URL or on Citus, whose servers do not wait for the held standby.
func NewHeld(tb testing.TB, schema string) *Held {
	tb.Helper()
	if cluster == nil || citus != nil {
		tb.Skip("pgtest: held commits need the throwaway PostgreSQL cluster; unset DATABASE_URL and ONCEKIT_CITUS to run this test")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "oncekit_held_" + hex.EncodeToString(b[:])
	pool := Pool(tb, schema, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
		c.ConnConfig.RuntimeParams["application_name"] = app
		c.MaxConns = 4
	})
	// Commits still held when the test ends (their client went away) would hold their
	// locks forever, and the schema's drop would wait for them: end them first.
	tb.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), baseURL)
		if err != nil {
			tb.Logf("pgtest: end held commits: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			tb.Logf("pgtest: end held commits: %v", err)
		}
	})
	return &Held{Pool: pool, app: app, url: baseURL}
}

// Terminate waits until a commit of the held pool is held, then terminates its backend
// and returns the backend's process ID. It fails the test when no commit is held within
// timeout.
func (h *Held) Terminate(ctx context.Context, tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	return h.act(ctx, tb, timeout, "pg_terminate_backend")
}

// act waits until a commit of the held pool is held, then calls signal, a function of
// PostgreSQL's, on its backend.
func (h *Held) act(ctx context.Context, tb testing.TB, timeout time.Duration, signal string) int {
	tb.Helper()
	conn, err := pgx.Connect(ctx, h.url)
	if err != nil {
		tb.Errorf("pgtest: connect: %v", err)
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(timeout)
	for {
		var pid int
		var started time.Time
		found := false
		rows, err := conn.Query(ctx, `SELECT pid, query_start FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'`, h.app)
		if err == nil {
			for rows.Next() {
				var c heldCommit
				if err = rows.Scan(&c.pid, &c.started); err != nil {
					break
				}
				if !found && !h.wasSeen(c) {
					pid, started, found = c.pid, c.started, true
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err == nil && !found {
			err = pgx.ErrNoRows
		}
		if err == nil {
			h.see(heldCommit{pid, started})
			if signal == "" {
				return pid
			}
			if _, err := conn.Exec(ctx, "SELECT "+signal+"($1)", pid); err != nil {
				tb.Errorf("pgtest: %s(%d): %v", signal, pid, err)
				return pid
			}
			// Returns once this commit is no longer held, so that a next call finds the
			// next commit, not this one again; the backend's next commit has a later
			// query_start.
			for {
				var held bool
				if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep' AND query_start = $2)`, pid, started).Scan(&held); err != nil {
					tb.Errorf("pgtest: watch %d: %v", pid, err)
					return pid
				}
				if !held {
					return pid
				}
				if time.Now().After(deadline) {
					tb.Errorf("pgtest: the commit of %d was still held %s after %s", pid, timeout, signal)
					return pid
				}
			}
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			tb.Errorf("pgtest: find a held commit: %v", err)
			return 0
		}
		if time.Now().After(deadline) {
			tb.Errorf("pgtest: no commit of the held pool was held within %s", timeout)
			return 0
		}
		t := time.NewTimer(2 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			tb.Errorf("pgtest: find a held commit: %v", ctx.Err())
			return 0
		case <-t.C:
		}
	}
}

// TerminateAsync runs [Held.Terminate] on its own goroutine; the returned channel
// closes when it is done.
func (h *Held) TerminateAsync(ctx context.Context, tb testing.TB, timeout time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Terminate(ctx, tb, timeout)
	}()
	return done
}

// Wait waits until a commit of the held pool that no earlier call found is held, and
// returns its backend's process ID, leaving it held.
func (h *Held) Wait(ctx context.Context, tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	return h.act(ctx, tb, timeout, "")
}

func (h *Held) wasSeen(c heldCommit) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.seen {
		if s.pid == c.pid && s.started.Equal(c.started) {
			return true
		}
	}
	return false
}

func (h *Held) see(c heldCommit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, c)
}

// Release waits until a commit of the held pool is held, then lets it through: a
// cancelled wait for a standby ends with the commit's success (and a warning). It
// returns the backend's process ID.
func (h *Held) Release(ctx context.Context, tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	return h.act(ctx, tb, timeout, "pg_cancel_backend")
}

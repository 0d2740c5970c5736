package outbox_test

// Tests of what a dispatcher reports when an answer from PostgreSQL is lost, through
// a TCP proxy that cuts the connection or drops the server's answers after a chosen
// round trip. The ledger's contract: once a commit is sent, an error other than
// ledger.ErrOutcomeUnknown means nothing committed.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

type rtPublications struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func (p *rtPublications) Publish(ctx context.Context, e outbox.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n[e.ID]++
	return nil
}

func (p *rtPublications) count(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id]
}

// rtOutbox is a migrated schema, an outbox on a direct pool (the truth) and a
// dispatcher whose pool goes through the proxy.
func rtOutbox(t *testing.T) (*outbox.Outbox, *outbox.Dispatcher, *rtProxy, *rtPublications, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	direct, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, direct, schema)
	require.NoError(t, err)
	od, err := outbox.New(direct, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	px := rtNewProxy(t)
	op, err := outbox.New(px.pool(t, schema), &outbox.Config{Schema: schema})
	require.NoError(t, err)
	pubs := &rtPublications{n: map[uuid.UUID]int{}}
	d, err := outbox.NewDispatcher(op, pubs, &outbox.DispatcherConfig{PublishTimeout: 300 * time.Millisecond, Lease: time.Second})
	require.NoError(t, err)
	return od, d, px, pubs, direct
}

func rtEnqueue(t *testing.T, o *outbox.Outbox, db *pgxpool.Pool) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	ids, err := o.Enqueue(ctx, tx, outbox.Event{Topic: "t", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return ids[0]
}

// TestRedteamDispatchOnceClaimAnswerLost cuts the connection right after the
// dispatcher sends the statement that claims its batch, a statement that commits by
// itself. The claim commits (the event is locked for the lease), yet DispatchOnce
// returns a plain error, which by the ledger's contract says nothing committed; it
// should match ledger.ErrOutcomeUnknown.
func TestRedteamDispatchOnceClaimAnswerLost(t *testing.T) {
	od, d, px, _, direct := rtOutbox(t)
	ctx := context.Background()
	for _, act := range []rtAction{rtCutAfter, rtBlackhole} {
		n := 1 // the claim
		id := rtEnqueue(t, od, direct)
		px.arm(act, n)
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := d.DispatchOnce(cctx)
		cancel()
		fired, at := px.disarm()
		if !fired {
			continue
		}
		px.settle(t, direct)
		rec, gerr := od.Get(ctx, id)
		require.NoError(t, gerr)
		t.Logf("round trip %d (%.40q), action %d: %v; event %s, locked until %v", n, at, act, err, rec.State, rec.LockedUntil)
		if rec.State == outbox.StatePending && !rec.LockedUntil.IsZero() && !errors.Is(err, ledger.ErrOutcomeUnknown) {
			t.Errorf("answer to round trip %d, %.60q, lost (action %d): the claim committed (locked until %v), yet DispatchOnce returned %v", n, at, act, rec.LockedUntil, err)
		}
		// Let the lease run out before the next round, so it claims a fresh batch.
		require.Eventually(t, func() bool {
			r, err := od.Get(ctx, id)
			require.NoError(t, err)
			return r.LockedUntil.Before(time.Now())
		}, 10*time.Second, 10*time.Millisecond)
		_, err = d.Drain(ctx)
		require.NoError(t, err)
	}
}

// TestRedteamDispatchOnceRecordAnswerLost cuts the connection after each round trip of
// DispatchOnce past the claim: a lost answer to the record of outcomes is reported as
// ledger.ErrOutcomeUnknown and retried, and the event is published once.
func TestRedteamDispatchOnceRecordAnswerLost(t *testing.T) {
	od, d, px, pubs, direct := rtOutbox(t)
	ctx := context.Background()
	for n := 2; ; n++ { // past the claim
		id := rtEnqueue(t, od, direct)
		px.arm(rtCutAfter, n)
		_, err := d.DispatchOnce(ctx)
		fired, at := px.disarm()
		if !fired {
			require.NoError(t, err)
			break
		}
		px.settle(t, direct)
		rec, gerr := od.Get(ctx, id)
		require.NoError(t, gerr)
		label := fmt.Sprintf("cut after round trip %d (%.60q)", n, at)
		if rec.State == outbox.StatePublished && err != nil {
			var lle *outbox.LeaseLostError
			require.True(t, errors.Is(err, ledger.ErrOutcomeUnknown) || errors.As(err, &lle), "%s: recorded, yet DispatchOnce returned %v", label, err)
		}
		require.Eventually(t, func() bool {
			_, err := d.Drain(ctx)
			require.NoError(t, err)
			r, err := od.Get(ctx, id)
			require.NoError(t, err)
			return r.State == outbox.StatePublished
		}, 15*time.Second, 20*time.Millisecond, label)
		require.Equal(t, 1, pubs.count(id), label)
	}
}

// rtProxy is a TCP proxy in front of the test server that reads the client's
// messages and, when armed, acts at the n-th round trip (a simple Query or a Sync)
// that executes a statement after arming: it forwards the round trip and then either cuts both sockets, or
// keeps forwarding what the client sends and drops every answer (a blackhole).
type rtProxy struct {
	ln net.Listener

	mu      sync.Mutex
	upNet   string
	upAddr  string
	act     rtAction
	left    int
	fired   bool
	firedAt string
	cut     []int // backends of the connections acted on
	conns   []net.Conn
}

type rtAction int

const (
	rtNone rtAction = iota
	rtCutAfter
	rtBlackhole
)

func rtNewProxy(t *testing.T) *rtProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &rtProxy{ln: ln}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
	})
	return p
}

// pool opens a pool on schema whose connections go through the proxy.
func (p *rtProxy) pool(t *testing.T, schema string) *pgxpool.Pool {
	return pgtest.Pool(t, schema, func(c *pgxpool.Config) {
		c.MaxConns = 4
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			// A cancel request dials the address the connection reached, the
			// proxy's: only the first dial names the server.
			p.mu.Lock()
			if p.upNet == "" {
				p.upNet, p.upAddr = network, addr
			}
			p.mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, "tcp", p.ln.Addr().String())
		}
	})
}

func (p *rtProxy) arm(a rtAction, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.act, p.left, p.fired, p.firedAt = a, n, false, ""
}

// disarm reports whether the proxy acted, and on which statements.
func (p *rtProxy) disarm() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.act = rtNone
	return p.fired, p.firedAt
}

func (p *rtProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *rtProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		network, addr := p.upNet, p.upAddr
		p.mu.Unlock()
		up, err := net.Dial(network, addr)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		pc := &rtConn{p: p, client: c, server: up, stmts: map[string]string{}, portals: map[string]string{}}
		go pc.serverToClient()
		go pc.clientToServer()
	}
}

type rtConn struct {
	p              *rtProxy
	client, server net.Conn
	mu             sync.Mutex
	drop           bool
	pid            int
	stmts, portals map[string]string
	pending        []string
}

func rtReadMsg(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	msg := make([]byte, int(binary.BigEndian.Uint32(h[1:]))-4)
	_, err := io.ReadFull(r, msg)
	return h[0], append(h[:], msg...), err
}

func rtCString(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

func (c *rtConn) serverToClient() {
	defer c.client.Close()
	for {
		typ, raw, err := rtReadMsg(c.server)
		if err != nil {
			return
		}
		c.mu.Lock()
		if typ == 'K' && len(raw) >= 9 {
			c.pid = int(binary.BigEndian.Uint32(raw[5:]))
		}
		drop := c.drop
		c.mu.Unlock()
		if !drop {
			if _, err := c.client.Write(raw); err != nil {
				return
			}
		}
	}
}

func (c *rtConn) clientToServer() {
	defer c.server.Close()
	// The startup message (or a cancel request) has no type byte.
	var hdr [4]byte
	if _, err := io.ReadFull(c.client, hdr[:]); err != nil {
		return
	}
	body := make([]byte, int(binary.BigEndian.Uint32(hdr[:]))-4)
	if _, err := io.ReadFull(c.client, body); err != nil {
		return
	}
	if _, err := c.server.Write(append(hdr[:], body...)); err != nil {
		return
	}
	var out []byte
	for {
		typ, raw, err := rtReadMsg(c.client)
		if err != nil {
			return
		}
		body := raw[5:]
		roundTrip := false
		switch typ {
		case 'Q':
			q, _ := rtCString(body)
			c.pending = append(c.pending, q)
			roundTrip = true
		case 'P':
			name, rest := rtCString(body)
			c.stmts[name], _ = rtCString(rest)
		case 'B':
			portal, rest := rtCString(body)
			stmt, _ := rtCString(rest)
			c.portals[portal] = c.stmts[stmt]
		case 'E':
			portal, _ := rtCString(body)
			c.pending = append(c.pending, c.portals[portal])
		case 'S':
			roundTrip = true
		}
		out = append(out, raw...)
		if !roundTrip && typ != 'X' && typ != 'H' {
			continue
		}
		act := rtNone
		// Only round trips that execute a statement count: a prepare commits nothing.
		if roundTrip && len(c.pending) > 0 && c.pending[0] != "" {
			p := c.p
			p.mu.Lock()
			if p.act != rtNone {
				p.left--
				if p.left == 0 {
					act, p.act, p.fired = p.act, rtNone, true
					p.firedAt = strings.Join(c.pending, "; ")
					c.mu.Lock()
					p.cut = append(p.cut, c.pid)
					c.mu.Unlock()
				}
			}
			p.mu.Unlock()
		}
		if roundTrip {
			c.pending = nil
		}
		if _, err := c.server.Write(out); err != nil {
			return
		}
		out = out[:0]
		switch act {
		case rtCutAfter:
			c.mu.Lock()
			c.drop = true
			c.mu.Unlock()
			_ = c.client.Close()
			// The server reads what it was sent, then the end of the stream.
			if cw, ok := c.server.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			_, _ = io.Copy(io.Discard, c.server)
			return
		case rtBlackhole:
			c.mu.Lock()
			c.drop = true
			c.mu.Unlock()
			_, _ = io.Copy(c.server, c.client)
			return
		}
	}
}

// settle waits until the backends of the connections the proxy acted on have
// ended, so that a statement they were sent has committed or rolled back before
// the truth is read.
func (p *rtProxy) settle(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	p.mu.Lock()
	pids := p.cut
	p.cut = nil
	p.mu.Unlock()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n))
		return n == 0
	}, 20*time.Second, 2*time.Millisecond)
}

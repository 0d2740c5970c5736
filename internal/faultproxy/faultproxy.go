// Package faultproxy is a TCP proxy for tests that sits between the code under test and
// PostgreSQL on loopback and, under a seeded plan, cuts, delays and half-closes the
// connections it carries at message boundaries of the PostgreSQL wire protocol.
//
// # Lost answers
//
// The proxy reads the client's messages, so it knows when a transaction's COMMIT goes
// by: a simple Query whose text is COMMIT (or END), or a Bind of a statement whose Parse
// said COMMIT. At a COMMIT the plan may forward it to the server, wait for the server to
// answer it, and then drop that answer and close the client's side ([CommitLost]), or
// send the client a FATAL 57P01 in its place ([CommitFatal]), as PostgreSQL does when it
// is told to terminate a backend while the commit's WAL flush is under way. Either way
// the transaction committed (or failed) on the server while the client did not hear
// which: the case a store must report as an unknown outcome.
//
// # Armed actions
//
// Beside its random plan, a proxy can be armed ([Proxy.Arm]) to act once after the n-th
// round trip from now on: cut the connection after forwarding it, so the server runs
// what it was sent and the client hears nothing ([CutAfter]), or drop every answer from
// then on ([Blackhole]). [Proxy.Settle] waits for the sessions acted on to end, so a
// test reads the truth only once their statements committed or rolled back.
//
// # Seeds
//
// Each connection draws its faults from a random source derived from the plan's seed
// and the connection's number, in the order connections are accepted: a seed replays
// the same plan; the interleaving is the scheduler's.
package faultproxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Kinds of fault, as [Plan].FaultFunc receives them.
const (
	// Cut closes both sides before a client's message is forwarded.
	Cut = "cut"
	// CutAnswer closes both sides before a server's message is forwarded.
	CutAnswer = "cut-answer"
	// Delay holds a client's message a while before it is forwarded.
	Delay = "delay"
	// HalfCloseServer shuts the write side towards the server: the server reads end of
	// file and ends the session, and the client hears what it sent before that.
	HalfCloseServer = "half-close-server"
	// HalfCloseClient shuts the write side towards the client: the client reads end of
	// file while its messages still reach the server.
	HalfCloseClient = "half-close-client"
	// CommitLost forwards a COMMIT, waits for its answer, drops it and closes the
	// connection.
	CommitLost = "commit-lost"
	// CommitFatal forwards a COMMIT, waits for its answer and sends the client a FATAL
	// (SQLSTATE 57P01) in its place, then closes the connection.
	CommitFatal = "commit-fatal"
)

// Plan says how often each fault happens. The probabilities are per message: per
// client message for Cut, Delay and the half-closes, per server message for CutAnswer,
// per COMMIT for CommitLost and CommitFatal.
type Plan struct {
	Seed uint64

	Cut, CutAnswer, Delay, HalfClose float64
	CommitLost, CommitFatal          float64
	// SyncLost and SyncFatal are CommitLost and CommitFatal for every other round
	// trip's end (a Sync, or a Query that is not a COMMIT): the answer of a statement
	// outside a transaction block, which commits by itself, or of a pipeline.
	SyncLost, SyncFatal float64
	// MaxDelay bounds a Delay. Defaults to 20ms.
	MaxDelay time.Duration

	// FaultFunc, when set, is told of every fault as it happens: its kind, the
	// connection's number, and a detail (the COMMIT's text, a delay's length).
	FaultFunc func(kind string, conn int, detail string)
}

// Proxy listens on a loopback port and forwards each connection to one PostgreSQL
// server, injecting the faults of its plan.
type Proxy struct {
	plan            Plan
	network, target string
	ln              net.Listener
	enabled         atomic.Bool
	nconn           atomic.Int64
	counts          sync.Map // kind -> *atomic.Int64

	mu    sync.Mutex
	conns map[*pconn]struct{}
	wg    sync.WaitGroup

	// armed is what Arm set, and what came of it.
	armMu sync.Mutex
	armed armed
	acted []int // server process IDs of the connections acted on
}

// Action is what an armed proxy does once it forwarded the round trip it waits for
// ([Proxy.Arm]).
type Action int

const (
	// CutAfter closes the client's side and ends the server's stream: the server runs
	// what it was sent, then reads end of file and ends the session, and the client
	// hears nothing more.
	CutAfter Action = iota + 1
	// Blackhole keeps forwarding what the client sends and drops every answer, as a
	// network partition that sends no reset does.
	Blackhole
)

type armed struct {
	act       Action
	left      int
	executing bool
	fired     bool
	at        string
}

// Target is the network and address a pgconn configuration dials: a Unix socket when
// its host is a directory, else TCP.
func Target(cfg *pgconn.Config) (network, addr string) {
	if strings.HasPrefix(cfg.Host, "/") {
		return "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	return "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

// New starts a proxy to the server at network and addr on a free loopback port. Its
// faults are on; [Proxy.SetEnabled] turns them off and on.
func New(network, addr string, plan Plan) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if plan.MaxDelay <= 0 {
		plan.MaxDelay = 20 * time.Millisecond
	}
	p := &Proxy{plan: plan, network: network, target: addr, ln: ln, conns: map[*pconn]struct{}{}}
	p.enabled.Store(true)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Start is [New] for a test: a proxy to the server that url (a connection string)
// names, closed at the test's cleanup.
func Start(tb testing.TB, url string, plan Plan) *Proxy {
	tb.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		tb.Fatalf("faultproxy: parse %q: %v", url, err)
	}
	network, addr := Target(cfg)
	p, err := New(network, addr, plan)
	if err != nil {
		tb.Fatalf("faultproxy: start: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Route points cfg at the proxy: its host and port become the proxy's, and fallbacks
// are dropped.
func (p *Proxy) Route(cfg *pgconn.Config) {
	a := p.ln.Addr().(*net.TCPAddr)
	cfg.Host, cfg.Port, cfg.Fallbacks = "127.0.0.1", uint16(a.Port), nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetEnabled turns the plan's faults on or off for every connection, open or new.
func (p *Proxy) SetEnabled(on bool) { p.enabled.Store(on) }

// Count is how many faults of kind the proxy injected so far.
func (p *Proxy) Count(kind string) int64 {
	if c, ok := p.counts.Load(kind); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// Close stops listening, closes every connection and waits for them.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.CloseConns()
	p.wg.Wait()
	return err
}

// CloseConns closes every connection the proxy carries; it goes on accepting new ones.
func (p *Proxy) CloseConns() {
	p.mu.Lock()
	conns := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Arm makes the proxy act once, by action, right after it forwarded the n-th round
// trip (a simple Query, or a Sync) that any of its connections sends from now on. With
// executing, only round trips that execute a statement count: one that only prepares
// or describes commits nothing. Arm replaces an earlier Arm that has not acted.
func (p *Proxy) Arm(action Action, n int, executing bool) {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	p.armed = armed{act: action, left: n, executing: executing}
}

// Disarm cancels the last Arm and reports whether it acted, and the statements of the
// round trip it acted after.
func (p *Proxy) Disarm() (fired bool, at string) {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	a := p.armed
	p.armed = armed{}
	return a.fired, a.at
}

// roundTrip counts a round trip that sent statements (their texts; "" for one the
// proxy did not see prepared) towards an Arm, and returns the action to take after
// forwarding it, or 0.
func (p *Proxy) roundTrip(c *pconn, statements []string) Action {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	a := &p.armed
	if a.act == 0 || a.fired || (a.executing && (len(statements) == 0 || statements[0] == "")) {
		return 0
	}
	if a.left--; a.left > 0 {
		return 0
	}
	a.fired, a.at = true, strings.Join(statements, "; ")
	c.mu.Lock()
	p.acted = append(p.acted, c.pid)
	c.mu.Unlock()
	return a.act
}

// Settle waits until the server sessions of the connections an Arm acted on have
// ended, so that what they were sent has committed or rolled back before a test reads
// the truth through db, a connection that does not go through the proxy.
func (p *Proxy) Settle(tb testing.TB, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) {
	tb.Helper()
	p.armMu.Lock()
	pids := p.acted
	p.acted = nil
	p.armMu.Unlock()
	require.Eventually(tb, func() bool {
		var n int
		require.NoError(tb, db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n))
		return n == 0
	}, 20*time.Second, 2*time.Millisecond, "the sessions acted on (%v) still run", pids)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		n := int(p.nconn.Add(1))
		server, err := net.DialTimeout(p.network, p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &pconn{p: p, n: n, client: client, server: server, rawAnswers: make(chan int, 4),
			crng: rand.New(rand.NewPCG(p.plan.Seed, uint64(2*n))), srng: rand.New(rand.NewPCG(p.plan.Seed, uint64(2*n+1)))}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go c.fromClient()
		go c.fromServer()
	}
}

func (p *Proxy) fault(kind string, conn int, detail string) {
	c, _ := p.counts.LoadOrStore(kind, &atomic.Int64{})
	c.(*atomic.Int64).Add(1)
	if p.plan.FaultFunc != nil {
		p.plan.FaultFunc(kind, conn, detail)
	}
}

// pconn is one proxied connection.
type pconn struct {
	p              *Proxy
	n              int
	client, server net.Conn
	crng, srng     *rand.Rand // the client reader's and the server reader's
	closeOnce      sync.Once
	// rawAnswers tells the server reader that an untyped one-byte answer (to an
	// SSLRequest or GSSENCRequest) comes next.
	rawAnswers chan int

	mu sync.Mutex
	// syncs counts the client's messages that end in a ReadyForQuery: Sync and Query.
	syncs int
	// commitAt is the number of the ReadyForQuery that ends a COMMIT's answer, or 0;
	// commitKind is the fault planned for that answer.
	commitAt   int
	commitKind string
	// pid is the server process's ID, from its BackendKeyData.
	pid int
	// dropping is set once an Arm acted: the server's answers are dropped.
	dropping atomic.Bool
}

func (c *pconn) close() {
	c.closeOnce.Do(func() {
		_ = c.client.Close()
		_ = c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

func (c *pconn) on() bool { return c.p.enabled.Load() }

// fromClient forwards the client's messages, planning faults at their boundaries.
func (c *pconn) fromClient() {
	defer c.p.wg.Done()
	// After a CutAfter the server reader drains the server's side until the server ends
	// the session, and closes the connection then.
	cut := false
	defer func() {
		if !cut {
			c.close()
		}
	}()
	// The server reader waits on rawAnswers until the startup is over: it is closed on
	// every way out, or that reader would wait forever and Close with it.
	rawOpen := true
	defer func() {
		if rawOpen {
			close(c.rawAnswers)
		}
	}()
	r := bufio.NewReaderSize(c.client, 64<<10)
	plan := c.p.plan
	// The startup phase: untyped messages, the last of which is the StartupMessage.
	for {
		msg, err := readUntyped(r)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == 80877103 || code == 80877104 { // SSLRequest, GSSENCRequest
			c.rawAnswers <- 1
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
		if code != 80877103 && code != 80877104 {
			break
		}
	}
	close(c.rawAnswers)
	rawOpen = false
	// The startup ends in a ReadyForQuery of its own, which the server reader counts.
	c.mu.Lock()
	c.syncs = 1
	c.mu.Unlock()
	statements := map[string]string{} // prepared statement name -> its text
	portals := map[string]string{}    // portal name -> its statement's text
	var sent []string                 // the statements of the round trip under way
	for {
		msg, err := readTyped(r)
		if err != nil {
			return
		}
		typ := msg[0]
		commit := false
		switch typ {
		case 'Q':
			// A simple-protocol batch is one Query of statements joined by semicolons.
			sent = append(sent, cstring(msg[5:]))
			q := strings.TrimRight(strings.TrimSpace(cstring(msg[5:])), ";")
			commit = isCommit(q[strings.LastIndex(q, ";")+1:])
		case 'P':
			name := cstring(msg[5:])
			statements[name] = cstring(msg[5+len(name)+1:])
		case 'B':
			portal := cstring(msg[5:])
			portals[portal] = statements[cstring(msg[5+len(portal)+1:])]
			commit = isCommit(portals[portal])
		case 'E':
			sent = append(sent, portals[cstring(msg[5:])])
		case 'C': // Close of a statement ('S') or a portal
			if len(msg) > 6 && msg[5] == 'S' {
				delete(statements, cstring(msg[6:]))
			}
		}
		if c.on() && typ != 'X' {
			x := c.crng.Float64()
			switch {
			case x < plan.Cut:
				c.p.fault(Cut, c.n, fmt.Sprintf("before %q", typ))
				return
			case x < plan.Cut+plan.HalfClose/2:
				c.p.fault(HalfCloseServer, c.n, fmt.Sprintf("before %q", typ))
				closeWrite(c.server)
				_, _ = io.Copy(io.Discard, r)
				return
			case x < plan.Cut+plan.HalfClose:
				c.p.fault(HalfCloseClient, c.n, fmt.Sprintf("before %q", typ))
				closeWrite(c.client)
			case x < plan.Cut+plan.HalfClose+plan.Delay:
				d := time.Duration(c.crng.Int64N(int64(plan.MaxDelay)))
				c.p.fault(Delay, c.n, d.String())
				time.Sleep(d)
			}
			switch {
			case commit:
				c.planCommit(typ, plan.CommitLost, plan.CommitFatal)
			case typ == 'S' || typ == 'Q':
				c.planCommit(typ, plan.SyncLost, plan.SyncFatal)
			}
		}
		c.mu.Lock()
		if typ == 'S' || typ == 'Q' {
			c.syncs++
		}
		c.mu.Unlock()
		var act Action
		if typ == 'S' || typ == 'Q' {
			act, sent = c.p.roundTrip(c, sent), nil
		}
		if act != 0 {
			// Before the round trip is forwarded: the server may answer it before this
			// goroutine runs again, and the answer must not reach the client.
			c.dropping.Store(true)
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
		switch act {
		case CutAfter:
			cut = true
			_ = c.client.Close()
			closeWrite(c.server)
			return
		case Blackhole:
			_, _ = io.Copy(c.server, r)
			return
		}
	}
}

// planCommit decides the fault, if any, for the answer to a COMMIT (or another round
// trip) about to be sent: lost with probability lost, a FATAL with probability fatal.
func (c *pconn) planCommit(typ byte, lost, fatal float64) {
	if lost+fatal == 0 {
		return
	}
	x := c.crng.Float64()
	kind := ""
	switch {
	case x < lost:
		kind = CommitLost
	case x < lost+fatal:
		kind = CommitFatal
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.commitAt != 0 {
		return
	}
	c.commitAt = c.syncs + 1 // the ReadyForQuery of this Query or Sync, or of the Sync that follows this Bind
	c.commitKind = kind
}

// fromServer forwards the server's messages; after a COMMIT with a planned fault it
// drops them until the COMMIT was answered, then injects the fault.
func (c *pconn) fromServer() {
	defer c.p.wg.Done()
	defer c.close()
	r := bufio.NewReaderSize(c.server, 64<<10)
	for range c.rawAnswers {
		b, err := r.ReadByte()
		if err != nil {
			return
		}
		if _, err := c.client.Write([]byte{b}); err != nil {
			return
		}
	}
	zs := 0
	for {
		msg, err := readTyped(r)
		if err != nil {
			return
		}
		if msg[0] == 'K' && len(msg) >= 9 { // BackendKeyData
			c.mu.Lock()
			c.pid = int(binary.BigEndian.Uint32(msg[5:9]))
			c.mu.Unlock()
		}
		if c.dropping.Load() {
			continue
		}
		c.mu.Lock()
		at, kind := c.commitAt, c.commitKind
		c.mu.Unlock()
		if at != 0 {
			// Everything from the COMMIT on is dropped: the client hears nothing more.
			if msg[0] == 'Z' {
				zs++
			}
			if zs < at {
				continue
			}
			c.p.fault(kind, c.n, "after the server answered")
			if kind == CommitFatal {
				_, _ = c.client.Write(fatal57P01)
			}
			return
		}
		if msg[0] == 'Z' {
			zs++
		}
		if c.on() && c.srng.Float64() < c.p.plan.CutAnswer {
			c.p.fault(CutAnswer, c.n, fmt.Sprintf("before %q", msg[0]))
			return
		}
		if _, err := c.client.Write(msg); err != nil {
			return
		}
	}
}

// fatal57P01 is the ErrorResponse PostgreSQL sends a backend's client when the backend
// is terminated.
var fatal57P01 = func() []byte {
	body := []byte{}
	for _, f := range []struct {
		code byte
		v    string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', "57P01"}, {'M', "terminating connection due to administrator command"}} {
		body = append(body, f.code)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	return append(msg, body...)
}()

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

func isCommit(q string) bool {
	q = strings.ToLower(strings.TrimSpace(strings.TrimRight(strings.TrimSpace(q), ";")))
	return q == "commit" || q == "end" || q == "commit work" || q == "commit transaction"
}

// cstring is the NUL-terminated string at the start of b.
func cstring(b []byte) string {
	for i, x := range b {
		if x == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

var errTooLarge = errors.New("faultproxy: message too large")

func readTyped(r *bufio.Reader) ([]byte, error) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > 1<<30 {
		return nil, errTooLarge
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr)
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}

func readUntyped(r *bufio.Reader) ([]byte, error) {
	hdr := make([]byte, 4)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n < 8 || n > 1<<20 {
		return nil, errTooLarge
	}
	msg := make([]byte, n)
	copy(msg, hdr)
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

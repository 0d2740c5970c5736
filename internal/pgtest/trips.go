package pgtest

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Trips counts the network round trips of the connections it dials (a write that
// follows a read starts a new one) and the time their reads spent waiting for the
// server.
type Trips struct {
	mu   sync.Mutex
	n    int64
	wait time.Duration
}

// Dial wraps dial (nil means a plain net.Dialer) so that its connections are counted.
func (t *Trips) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, t: t}, nil
	}
}

// Reset sets the count and the wait to zero.
func (t *Trips) Reset() {
	t.mu.Lock()
	t.n, t.wait = 0, 0
	t.mu.Unlock()
}

// Wait returns the time spent in reads since the last Reset: with one connection at
// a time, an operation's time less its Wait is the time the client itself took.
func (t *Trips) Wait() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wait
}

// Load returns the round trips counted since the last Reset.
func (t *Trips) Load() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

type countingConn struct {
	net.Conn
	t       *Trips
	inTrip  bool
	sawRead bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.t.mu.Lock()
	if !c.inTrip || c.sawRead {
		c.t.n++
		c.inTrip, c.sawRead = true, false
	}
	c.t.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	start := time.Now()
	n, err := c.Conn.Read(p)
	d := time.Since(start)
	c.t.mu.Lock()
	c.t.wait += d
	if n > 0 {
		c.sawRead = true
	}
	c.t.mu.Unlock()
	return n, err
}

package main

import (
	"context"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// delayed wraps dial so that every answer from the server reaches the client rtt after
// it arrived: a network whose round trip is rtt longer than this machine's loopback, as
// between an application and its database in another availability zone. Bytes sent
// pass at once; what arrives in one read is held as one packet, so a pipelined batch's
// answers pay rtt once, as they would on a real network.
func delayed(dial pgconn.DialFunc, rtt time.Duration) pgconn.DialFunc {
	if rtt <= 0 {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		d := &delayedConn{Conn: c, in: make(chan packet, 1024)}
		go d.pump(rtt)
		return d, nil
	}
}

type packet struct {
	b   []byte
	at  time.Time // when the client may read it
	err error
}

type delayedConn struct {
	net.Conn
	in   chan packet
	rest []byte
	err  error
}

func (d *delayedConn) pump(rtt time.Duration) {
	for {
		buf := make([]byte, 32<<10)
		n, err := d.Conn.Read(buf)
		d.in <- packet{b: buf[:n], at: time.Now().Add(rtt), err: err}
		if err != nil {
			close(d.in)
			return
		}
	}
}

func (d *delayedConn) Read(b []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		p, ok := <-d.in
		if !ok {
			return 0, net.ErrClosed
		}
		time.Sleep(time.Until(p.at))
		d.rest, d.err = p.b, p.err
	}
	n := copy(b, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

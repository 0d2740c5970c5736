// Package proc serves the child processes oncekit's tests and development tools start,
// PostgreSQL clusters and the Temporal dev server: a port for each to listen on, and a
// way to stop them.
package proc

import (
	"net"
	"os"
	"syscall"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now, for a child
// server to listen on.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// Interrupt asks p to shut down (SIGINT) and waits until exited delivers or is closed;
// past grace it kills p and waits again.
func Interrupt[T any](p *os.Process, exited <-chan T, grace time.Duration) {
	_ = p.Signal(syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
	}
}

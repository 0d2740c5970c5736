// Package proc stops the child processes oncekit's tests and development tools start:
// PostgreSQL clusters and the Temporal dev server.
package proc

import (
	"os"
	"syscall"
	"time"
)

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

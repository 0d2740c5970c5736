package proc_test

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/proc"
)

// start runs a shell script and returns its command and a channel closed when it exits.
func start(t *testing.T, script string) (*exec.Cmd, chan struct{}) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return cmd, exited
}

func TestInterrupt(t *testing.T) {
	t.Parallel()
	t.Run("ends on SIGINT", func(t *testing.T) {
		t.Parallel()
		cmd, exited := start(t, "exec sleep 60")
		proc.Interrupt(cmd.Process, exited, time.Minute)
		require.Equal(t, "signal: interrupt", cmd.ProcessState.String(), "SIGINT ended it, not a kill")
	})
	t.Run("killed past its grace", func(t *testing.T) {
		t.Parallel()
		// The shell ignores SIGINT, and waits for a child that ignores it too.
		cmd, exited := start(t, `trap "" INT; sleep 60 & wait`)
		time.Sleep(100 * time.Millisecond) // the trap is set
		proc.Interrupt(cmd.Process, exited, 200*time.Millisecond)
		select {
		case <-exited:
		default:
			t.Fatal("Interrupt returned before the process exited")
		}
		require.Equal(t, "signal: killed", cmd.ProcessState.String())
	})
}

// A free port is one a server can listen on at once.
func TestFreePort_ServerCanListen(t *testing.T) {
	port, err := proc.FreePort()
	require.NoError(t, err)
	require.Positive(t, port)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	require.NoError(t, err)
	require.NoError(t, l.Close())
}

package testsuite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// workerProcessEnv names the worker a child process runs.
const workerProcessEnv = "ONCEKIT_TESTSUITE_WORKER_PROCESS"

// WorkerMain is the body of a worker process: it runs a worker until ctx is done.
type WorkerMain func(ctx context.Context) error

// RunWorkerProcess makes the test binary double as a worker process. Call it first in
// TestMain. In a process started by [StartWorkerProcess] it runs the named worker until
// the process is signalled or killed, and never returns; anywhere else it returns at once.
func RunWorkerProcess(workers map[string]WorkerMain) {
	name := os.Getenv(workerProcessEnv)
	if name == "" {
		return
	}
	run, ok := workers[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "oncekit/testsuite: no worker process named %q\n", name)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "oncekit/testsuite: worker process %q: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Mark prints a line a parent test waits for with [WorkerProcess.WaitFor], such as
// "effect committed", from a worker process.
func Mark(line string) {
	fmt.Fprintln(os.Stdout, "oncekit-mark: "+line)
}

// WorkerProcess is a worker running in a child process of the test.
type WorkerProcess struct {
	cmd    *exec.Cmd
	marks  chan string
	exited chan struct{}
	mu     sync.Mutex
	state  *os.ProcessState
}

// StartWorkerProcess starts the test binary again as the worker registered under name
// with [RunWorkerProcess], with env added to its environment. The process is killed at
// the end of the test.
func StartWorkerProcess(t testing.TB, name string, env map[string]string) *WorkerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerProcessEnv+"="+name)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("oncekit/testsuite: worker process: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("oncekit/testsuite: start worker process: %v", err)
	}
	p := &WorkerProcess{cmd: cmd, marks: make(chan string, 64), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m, ok := strings.CutPrefix(sc.Text(), "oncekit-mark: "); ok {
				p.marks <- m
			}
		}
		_ = cmd.Wait()
		p.mu.Lock()
		p.state = cmd.ProcessState
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() { p.Kill() })
	return p
}

// WaitFor waits until the process prints mark with [Mark], and fails the test after
// timeout or if the process exits first.
func (p *WorkerProcess) WaitFor(t testing.TB, mark string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-p.marks:
			if m == mark {
				return
			}
		case <-p.exited:
			t.Fatalf("oncekit/testsuite: worker process exited before %q", mark)
		case <-deadline:
			t.Fatalf("oncekit/testsuite: worker process did not print %q within %s", mark, timeout)
		}
	}
}

// WaitForAll waits until the process has printed every one of marks with [Mark], in any
// order, and fails the test after timeout or if the process exits first.
func (p *WorkerProcess) WaitForAll(t testing.TB, marks []string, timeout time.Duration) {
	t.Helper()
	want := map[string]bool{}
	for _, m := range marks {
		want[m] = true
	}
	deadline := time.After(timeout)
	for len(want) > 0 {
		select {
		case m := <-p.marks:
			delete(want, m)
		case <-p.exited:
			t.Fatalf("oncekit/testsuite: worker process exited before printing %d of its marks", len(want))
		case <-deadline:
			t.Fatalf("oncekit/testsuite: worker process did not print %d of its marks within %s", len(want), timeout)
		}
	}
}

// Kill sends SIGKILL, as an out-of-memory killer or a lost machine would, and waits for
// the process to be gone. It reports whether the process was still running.
func (p *WorkerProcess) Kill() bool {
	select {
	case <-p.exited:
		return false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	return true
}

// Wait waits up to timeout for the process to exit by itself and returns its exit code
// (-1 when a signal ended it). It returns an error, and leaves the process running, when
// the process is still running after timeout.
func (p *WorkerProcess) Wait(timeout time.Duration) (int, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state.ExitCode(), nil
	case <-t.C:
		return 0, fmt.Errorf("oncekit/testsuite: worker process still running after %s", timeout)
	}
}

// Stop asks the process to shut down as a deployment would, with SIGTERM, and waits up
// to timeout for it to exit; see [WorkerProcess.Wait].
func (p *WorkerProcess) Stop(timeout time.Duration) (int, error) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	return p.Wait(timeout)
}

// Killed reports whether the process ended by SIGKILL.
func (p *WorkerProcess) Killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return false
	}
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// Package devserver provides a real Temporal server for tests and the demo: the one at
// TEMPORAL_ADDRESS when it is set, otherwise a dev server started from the Temporal CLI,
// which is built from source once and cached.
//
// It launches the CLI itself rather than through the SDK's testsuite.StartDevServer
// (ExistingPath), because a test binary's shared dev server has no test that owns it
// and stops it: it must die with the process. The SDK's launcher sets no parent-death
// signal, and a test that started a server through it and exited without Stop left
// "go test" waiting 60 s ("WaitDelay expired before I/O complete", the orphan holding
// its output) and the server running after it. Here the server gets SIGKILL when its
// parent dies.
package devserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/internal/proc"
)

// CLIVersion is the Temporal CLI built for the dev server (Temporal server 1.29.1).
// Later CLI releases cannot be built with go install.
const CLIVersion = "v1.5.1"

// CacheDir returns where built tools are kept: $ONCEKIT_CACHE, else
// $XDG_CACHE_HOME/oncekit, else ~/.cache/oncekit.
func CacheDir() string { return config.CacheDir() }

// CLIPath returns the path of the cached Temporal CLI binary.
func CLIPath() string {
	return filepath.Join(CacheDir(), "temporal-cli-"+CLIVersion, "temporal")
}

// EnsureCLI returns the path of the Temporal CLI, building it with go install into the
// cache when it is not there yet. A build takes a few minutes; progress goes to progress.
// Concurrent callers (test packages running in parallel) wait for one build.
func EnsureCLI(ctx context.Context, progress io.Writer) (string, error) {
	path := CLIPath()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(path); err == nil {
		return path, nil // another process built it while we waited
	}
	if progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "devserver: building the Temporal CLI %s from source into %s (a few minutes, once)\n", CLIVersion, dir)
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/temporalio/cli/cmd/temporal@"+CLIVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod")
	cmd.Stdout, cmd.Stderr = progress, progress
	done := make(chan struct{})
	start := time.Now()
	go func() {
		t := time.NewTicker(20 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(progress, "devserver: still building the Temporal CLI (%s)\n", time.Since(start).Round(time.Second))
			}
		}
	}()
	err = cmd.Run()
	close(done)
	if err != nil {
		return "", fmt.Errorf("devserver: go install temporal %s: %w", CLIVersion, err)
	}
	if err := os.Rename(filepath.Join(tmp, "temporal"), path); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "devserver: built the Temporal CLI in %s\n", time.Since(start).Round(time.Second))
	return path, nil
}

// Server is a running Temporal server.
type Server struct {
	// HostPort is the frontend address.
	HostPort string
	// Namespace is the namespace to use.
	Namespace string
	// UIAddress is the web UI's address, when this process started the server with one.
	UIAddress string
	cmd       *exec.Cmd
	exited    chan struct{}
	path      string
	args      []string
	log       io.Writer
}

// Options configure [Start].
type Options struct {
	// Progress receives build progress. Defaults to discarding it.
	Progress io.Writer
	// UIPort, when not 0, enables the web UI on that port.
	UIPort int
	// Log receives the server's own output. Defaults to discarding it.
	Log io.Writer
	// DBFile keeps the server's state in this SQLite file, so that a restart finds its
	// workflows again. Defaults to memory only.
	DBFile string
}

// Start returns the server at TEMPORAL_ADDRESS when it is set, otherwise starts a dev
// server from the cached CLI (building it first if needed) on a free local port. The
// dev server dies with this process.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	ns := os.Getenv("TEMPORAL_NAMESPACE")
	if ns == "" {
		ns = "default"
	}
	if addr := os.Getenv("TEMPORAL_ADDRESS"); addr != "" {
		return &Server{HostPort: addr, Namespace: ns}, nil
	}
	path, err := EnsureCLI(ctx, o.Progress)
	if err != nil {
		return nil, err
	}
	return startCLI(ctx, path, ns, o)
}

// startCLI starts the dev server of the CLI at path. Another process may take the free
// port before the server binds it, or one of the ports the server picks for itself: a
// server that exits during its start is tried again, on a new port.
func startCLI(ctx context.Context, path, ns string, o Options) (*Server, error) {
	for attempt := 1; ; attempt++ {
		port, err := proc.FreePort()
		if err != nil {
			return nil, err
		}
		s := &Server{HostPort: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Namespace: ns, exited: make(chan struct{})}
		args := []string{"server", "start-dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(port), "--namespace", ns,
			"--log-level", "error", "--dynamic-config-value", "frontend.enableServerVersionCheck=false"}
		if o.UIPort != 0 {
			args = append(args, "--ui-port", strconv.Itoa(o.UIPort))
			s.UIAddress = fmt.Sprintf("http://127.0.0.1:%d", o.UIPort)
		} else {
			args = append(args, "--headless")
		}
		if o.DBFile != "" {
			args = append(args, "--db-filename", o.DBFile)
		}
		s.path, s.args, s.log = path, args, o.Log
		if s.log == nil {
			s.log = io.Discard
		}
		err = s.start(ctx)
		if err == nil {
			return s, nil
		}
		if attempt == startAttempts || !errors.Is(err, errExited) {
			return nil, err
		}
	}
}

// startAttempts bounds the starts tried when a server exits during its start.
const startAttempts = 3

// errExited marks a server that exited during its start.
var errExited = errors.New("devserver: the Temporal dev server exited during start")

func (s *Server) start(ctx context.Context) error {
	cmd := exec.Command(s.path, s.args...)
	tail := &tailWriter{w: s.log}
	cmd.Stdout, cmd.Stderr = tail, tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("devserver: start %s: %w", s.path, err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		_ = s.Stop()
		if errors.Is(err, errExited) {
			if out := tail.String(); out != "" {
				err = fmt.Errorf("%w; its last output: %s", err, out)
			}
		}
		return err
	}
	return nil
}

// tailWriter passes output on to w and keeps its last 2 KiB, to explain a failed start.
type tailWriter struct {
	w   io.Writer
	mu  sync.Mutex
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2048 {
		t.buf = t.buf[len(t.buf)-2048:]
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// Crash SIGKILLs a dev server this process started, keeps it down for down, and starts
// it again on the same port; with Options.DBFile it finds its workflows again.
func (s *Server) Crash(ctx context.Context, down time.Duration) error {
	if s.cmd == nil {
		return errors.New("devserver: Crash needs a dev server this process started")
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	t := time.NewTimer(down)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	var err error
	for range startAttempts {
		// The server picks its internal ports anew; another process may hold one.
		if err = s.start(ctx); !errors.Is(err, errExited) {
			break
		}
	}
	return err
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.exited:
			return errExited
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := client.DialContext(cctx, client.Options{HostPort: s.HostPort, Namespace: s.Namespace, Logger: QuietLogger{}})
		if err == nil {
			_, err = c.WorkflowService().DescribeNamespace(cctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.Namespace})
			c.Close()
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("devserver: the Temporal dev server at %s was not ready within %s: %w", s.HostPort, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops a dev server this process started; it leaves TEMPORAL_ADDRESS alone.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	proc.Interrupt(s.cmd.Process, s.exited, 10*time.Second)
	return nil
}

// QuietLogger drops a Temporal client's logs, which would drown test output.
type QuietLogger struct{}

func (QuietLogger) Debug(string, ...any) {}
func (QuietLogger) Info(string, ...any)  {}
func (QuietLogger) Warn(string, ...any)  {}
func (QuietLogger) Error(string, ...any) {}

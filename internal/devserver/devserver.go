// Package devserver provides a real Temporal server for tests and the demo: the one at
// TEMPORAL_ADDRESS when it is set, otherwise a dev server started from the Temporal CLI,
// which is built from source once and cached.
package devserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
)

// CLIVersion is the Temporal CLI built for the dev server (Temporal server 1.29.1).
// Later CLI releases cannot be built with go install.
const CLIVersion = "v1.5.1"

// CacheDir returns where built tools are kept: $ONCEKIT_CACHE, else
// $XDG_CACHE_HOME/oncekit, else ~/.cache/oncekit.
func CacheDir() string {
	if d := os.Getenv("ONCEKIT_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "oncekit")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "oncekit")
	}
	return filepath.Join(os.TempDir(), "oncekit-cache")
}

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
	dev       *testsuite.DevServer
}

// Options configure [Start].
type Options struct {
	// Progress receives build progress. Defaults to discarding it.
	Progress io.Writer
	// UIPort, when not empty, enables the web UI on that port.
	UIPort string
	// Logger is the client's logger. Defaults to a quiet one.
	Logger log.Logger
}

// Start returns the server at TEMPORAL_ADDRESS when it is set, otherwise starts a dev
// server from the cached CLI (building it first if needed) on a free local port.
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
	logger := o.Logger
	if logger == nil {
		logger = quietLogger{}
	}
	dev, err := testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
		ExistingPath:  path,
		ClientOptions: &client.Options{Namespace: ns, Logger: logger},
		EnableUI:      o.UIPort != "",
		UIPort:        o.UIPort,
		LogLevel:      "error",
		Stdout:        io.Discard,
		Stderr:        io.Discard,
	})
	if err != nil {
		return nil, fmt.Errorf("devserver: start: %w", err)
	}
	return &Server{HostPort: dev.FrontendHostPort(), Namespace: ns, dev: dev}, nil
}

// Stop stops a dev server this process started; it leaves TEMPORAL_ADDRESS alone.
func (s *Server) Stop() error {
	if s.dev == nil {
		return nil
	}
	err := s.dev.Stop()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // killed on purpose
	}
	return err
}

// quietLogger drops the client's logs, which would drown test output.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}

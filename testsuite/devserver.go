package testsuite

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/devserver"
)

var (
	devOnce   sync.Once
	devServer *devserver.Server
	devErr    error
)

// DevServer is a real Temporal server for tests.
type DevServer struct {
	// HostPort is the frontend address to dial.
	HostPort string
	// Namespace is the namespace to use.
	Namespace string
}

// StartDevServer returns a real Temporal server shared by the tests of the package: the
// one at TEMPORAL_ADDRESS when set, otherwise a dev server started once per test binary
// from the Temporal CLI, built from source and cached on first use (minutes; progress is
// printed). The dev server dies with the test binary.
func StartDevServer(t testing.TB) DevServer {
	t.Helper()
	devOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		devServer, devErr = devserver.Start(ctx, &devserver.Options{Progress: os.Stderr})
	})
	if devErr != nil {
		t.Fatalf("oncekit/testsuite: %v", devErr)
	}
	return DevServer{HostPort: devServer.HostPort, Namespace: devServer.Namespace}
}

package testsuite

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/devenv"
)

var (
	devOnce sync.Once
	dev     *devenv.Env
	devErr  error
)

// StartDevServer returns a real Temporal server shared by the tests of the package (see
// package devenv): the one at TEMPORAL_ADDRESS when it is set, else a dev server
// started once per test binary and gone with it.
func StartDevServer(t testing.TB) *devenv.Env {
	t.Helper()
	devOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		dev, devErr = devenv.Start(ctx, &devenv.Config{NoPostgres: true})
	})
	if devErr != nil {
		t.Fatalf("oncekit/testsuite: %v", devErr)
	}
	return dev
}

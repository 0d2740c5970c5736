package testsuite

import (
	"context"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/devserver"
	"github.com/oncekit/oncekit/internal/pgtest"
)

// Temporal is a real Temporal server for tests and demos.
type Temporal struct {
	// HostPort is the frontend address to dial.
	HostPort string
	// Namespace is the namespace to use.
	Namespace string
	// UIAddress is the web UI's address when the server was started with one.
	UIAddress string
	srv       *devserver.Server
}

// TemporalConfig configure [StartTemporal]. A nil *TemporalConfig means all defaults.
type TemporalConfig struct {
	// UIPort, when not 0, serves the web UI on that port. Defaults to 0: headless.
	UIPort int
	// Progress receives progress of the one-time CLI build. Defaults to os.Stderr.
	Progress io.Writer
}

// StartTemporal returns the server at TEMPORAL_ADDRESS (namespace TEMPORAL_NAMESPACE,
// else "default") when it is set. Otherwise it starts a Temporal dev server on a free
// local port, from the Temporal CLI v1.5.1 that it builds from source with go install
// into ~/.cache/oncekit the first time (a few minutes, with progress). The dev server
// dies with this process.
func StartTemporal(ctx context.Context, opts *TemporalConfig) (*Temporal, error) {
	o := TemporalConfig{Progress: os.Stderr}
	if opts != nil {
		o = *opts
	}
	srv, err := devserver.Start(ctx, &devserver.Options{Progress: o.Progress, UIPort: o.UIPort})
	if err != nil {
		return nil, err
	}
	return &Temporal{HostPort: srv.HostPort, Namespace: srv.Namespace, UIAddress: srv.UIAddress, srv: srv}, nil
}

// Stop stops a dev server that StartTemporal started.
func (t *Temporal) Stop() error { return t.srv.Stop() }

// Postgres is a PostgreSQL server for tests and demos.
type Postgres struct {
	// URL is the connection string.
	URL     string
	cluster *pgtest.Cluster
}

// StartPostgres returns the server at DATABASE_URL when it is set. Otherwise it starts a
// throwaway cluster from the machine's PostgreSQL binaries in a temporary directory (as
// the "postgres" OS user when running as root), listening on a unix socket.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return &Postgres{URL: url}, nil
	}
	c, err := pgtest.StartCluster(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: c.ConnString(), cluster: c}, nil
}

// Close stops and removes a throwaway cluster; it leaves DATABASE_URL's server alone.
func (p *Postgres) Close() error {
	if p.cluster == nil {
		return nil
	}
	return p.cluster.Close()
}

var (
	devOnce sync.Once
	dev     *Temporal
	devErr  error
)

// DevServer is a real Temporal server shared by the tests of a package.
type DevServer struct {
	// HostPort is the frontend address to dial.
	HostPort string
	// Namespace is the namespace to use.
	Namespace string
}

// StartDevServer returns a real Temporal server shared by the tests of the package, see
// [StartTemporal]: started once per test binary and gone with it.
func StartDevServer(t testing.TB) DevServer {
	t.Helper()
	devOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		dev, devErr = StartTemporal(ctx, nil)
	})
	if devErr != nil {
		t.Fatalf("oncekit/testsuite: %v", devErr)
	}
	return DevServer{HostPort: dev.HostPort, Namespace: dev.Namespace}
}

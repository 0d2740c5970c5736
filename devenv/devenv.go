// Package devenv provides the servers oncekit's demos, benchmarks and tests run
// against: a PostgreSQL server and a Temporal server, behind one type. It uses the
// servers named by DATABASE_URL and TEMPORAL_ADDRESS when they are set; otherwise it
// starts a throwaway PostgreSQL cluster from the machine's server binaries and a
// Temporal dev server from the Temporal CLI, which it builds from source once into
// ~/.cache/oncekit. Both die with the process that started them.
package devenv

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"

	tlog "go.temporal.io/sdk/log"

	"github.com/oncekit/oncekit/internal/devserver"
	"github.com/oncekit/oncekit/internal/pgtest"
)

// Config says which servers to provide. A nil *Config means both, with defaults.
type Config struct {
	// NoPostgres skips PostgreSQL. Defaults to false.
	NoPostgres bool
	// NoTemporal skips Temporal. Defaults to false.
	NoTemporal bool
	// UIPort, when not 0, serves Temporal's web UI on that port. Defaults to 0: headless.
	UIPort int
	// Progress receives the progress of the one-time Temporal CLI build. Defaults to
	// discarding it.
	Progress io.Writer
}

// Env is a PostgreSQL server and a Temporal server.
type Env struct {
	// DatabaseURL is the PostgreSQL connection string; empty with NoPostgres.
	DatabaseURL string
	// TemporalAddress is the Temporal frontend's host:port and Namespace the namespace to
	// use; empty with NoTemporal.
	TemporalAddress string
	Namespace       string
	// UIAddress is the web UI's address when Config.UIPort asked for one.
	UIAddress string

	cluster *pgtest.Cluster
	dev     *devserver.Server
}

// Start provides the servers cfg asks for.
func Start(ctx context.Context, cfg *Config) (*Env, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	e := &Env{}
	if !c.NoPostgres {
		if err := e.startPostgres(ctx); err != nil {
			return nil, err
		}
	}
	if !c.NoTemporal {
		dev, err := devserver.Start(ctx, &devserver.Options{Progress: c.Progress, UIPort: c.UIPort})
		if err != nil {
			return nil, errors.Join(err, e.Close())
		}
		e.dev = dev
		e.TemporalAddress, e.Namespace, e.UIAddress = dev.HostPort, dev.Namespace, dev.UIAddress
	}
	return e, nil
}

func (e *Env) startPostgres(ctx context.Context) error {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		e.DatabaseURL = url
		return nil
	}
	cluster, err := pgtest.StartCluster(ctx, nil)
	if err != nil {
		return err
	}
	e.cluster, e.DatabaseURL = cluster, cluster.ConnString()
	return nil
}

// Close stops the servers Start started; it leaves DATABASE_URL's and TEMPORAL_ADDRESS's
// alone.
func (e *Env) Close() error {
	var errs []error
	if e.dev != nil {
		errs = append(errs, e.dev.Stop())
		e.dev = nil
	}
	if e.cluster != nil {
		errs = append(errs, e.cluster.Close())
		e.cluster = nil
	}
	return errors.Join(errs...)
}

// QuietLogger returns a Temporal logger that drops everything: Temporal's structured
// logger on a discarding slog handler, for clients whose logs would drown a demo's or a
// test's output.
func QuietLogger() tlog.Logger { return tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)) }

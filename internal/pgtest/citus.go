package pgtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/config"
)

// Citus is a throwaway Citus cluster: a coordinator and its workers, each a [Cluster]
// listening on 127.0.0.1, with the citus extension created and the workers added to the
// coordinator's metadata. Clients connect to the coordinator.
type Citus struct {
	Coordinator *Cluster
	Workers     []*Cluster
}

// CitusOpts configure a throwaway Citus cluster.
type CitusOpts struct {
	// Workers is how many worker nodes to start. Defaults to [CitusWorkersDefault].
	Workers int
	// ShardCount is the coordinator's citus.shard_count: how many shards a table
	// distributed without an explicit count gets. Defaults to [CitusShardCountDefault].
	ShardCount int
	// Durable keeps fsync and synchronous commit on, as ClusterOpts.Durable. Defaults to
	// false.
	Durable bool
	// Progress receives the output of the one-time build of Citus. Defaults to
	// discarding it.
	Progress io.Writer
}

// Defaults of [CitusOpts].
const (
	// CitusWorkersDefault is two workers: enough for tenants on different nodes.
	CitusWorkersDefault = 2
	// CitusShardCountDefault is four shards per table: two on each default worker, and
	// few enough that creating a distributed table in every test stays cheap.
	CitusShardCountDefault = 4
)

// CitusTarballEnv names the environment variable that gives the path of a Citus source
// tarball (a `git archive` of a Citus release tag, such as citus-13.2.2.tar.gz).
const CitusTarballEnv = "ONCEKIT_CITUS_TARBALL"

// citusDefaultTarball is where the tarball is looked for when CitusTarballEnv is unset,
// relative to the repository's root.
const citusDefaultTarball = "../shared/vendor/citus-13.2.2.tar.gz"

// ErrNoCitus reports that no Citus source tarball was found; its text says how to get one.
var ErrNoCitus = errors.New("pgtest: no Citus source tarball: set " + CitusTarballEnv +
	" to a Citus release's source (for example `git clone --depth 1 -b v13.2.2 https://github.com/citusdata/citus && " +
	"git -C citus archive --prefix=citus-13.2.2/ -o citus-13.2.2.tar.gz HEAD`), or place it at " + citusDefaultTarball +
	" beside the repository; building it needs the apt packages postgresql-server-dev-<major> (at the server's version), libzstd-dev and libkrb5-dev")

// CitusTarball returns the Citus source tarball to build: $ONCEKIT_CITUS_TARBALL, or
// ../shared/vendor/citus-13.2.2.tar.gz beside the repository that holds the working
// directory. It returns [ErrNoCitus] when there is none.
func CitusTarball() (string, error) {
	if p := os.Getenv(CitusTarballEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %w)", ErrNoCitus, CitusTarballEnv, p, err)
		}
		return filepath.Abs(p)
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if b, _ := os.ReadFile(filepath.Join(dir, "go.mod")); bytes.HasPrefix(b, []byte("module github.com/oncekit/oncekit\n")) {
				for _, root := range []string{dir, mainCheckout(dir)} {
					p := filepath.Join(root, citusDefaultTarball)
					if _, err := os.Stat(p); root != "" && err == nil {
						return p, nil
					}
				}
				return "", ErrNoCitus
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoCitus
		}
		dir = parent
	}
}

// mainCheckout returns the main checkout of the git worktree at dir, or "" when dir is
// not a linked worktree: its .git file names a directory whose commondir leads there.
func mainCheckout(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ".git"))
	if err != nil {
		return ""
	}
	gitdir, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
	if !ok {
		return ""
	}
	common, err := os.ReadFile(filepath.Join(gitdir, "commondir"))
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(common))
	if !filepath.IsAbs(c) {
		c = filepath.Join(gitdir, c)
	}
	return filepath.Dir(filepath.Clean(c))
}

// EnsureCitus builds Citus from tarball for the machine's PostgreSQL once, caching the
// installed files under the oncekit cache directory by the tarball's SHA-256 and the
// PostgreSQL major version, and installs them into the server's library and extension
// directories when they are not there yet. A build takes about two minutes on two cores.
func EnsureCitus(ctx context.Context, tarball string, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	binDir, err := findBinDir()
	if err != nil {
		return err
	}
	pgConfig := filepath.Join(binDir, "pg_config")
	if _, err := os.Stat(pgConfig); err != nil {
		return fmt.Errorf("pgtest: building Citus needs %s: install postgresql-server-dev-<major> at the server's version", pgConfig)
	}
	major, pkglib, share, err := pgConfigDirs(ctx, pgConfig)
	if err != nil {
		return err
	}
	sum, err := fileSHA256(tarball)
	if err != nil {
		return err
	}
	cache := filepath.Join(config.CacheDir(), "citus-"+sum[:16]+"-pg"+major)
	stage := filepath.Join(cache, "stage")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	// Test binaries of several packages start clusters at once: one builds, the others wait.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(cache, "built")); err != nil {
		if err := buildCitus(ctx, tarball, pgConfig, stage, progress); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(cache, "built"), []byte(tarball+"\n"), 0o644); err != nil {
			return err
		}
	}
	return installCitus(stage, pkglib, share)
}

func pgConfigDirs(ctx context.Context, pgConfig string) (major, pkglib, share string, err error) {
	out, err := exec.CommandContext(ctx, pgConfig, "--version", "--pkglibdir", "--sharedir").Output()
	if err != nil {
		return "", "", "", fmt.Errorf("pgtest: %s: %w", pgConfig, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		return "", "", "", fmt.Errorf("pgtest: unexpected output of %s: %q", pgConfig, out)
	}
	v := strings.Fields(lines[0]) // PostgreSQL 15.18 (Debian ...)
	if len(v) < 2 {
		return "", "", "", fmt.Errorf("pgtest: unexpected version from %s: %q", pgConfig, lines[0])
	}
	major, _, _ = strings.Cut(v[1], ".")
	return major, lines[1], lines[2], nil
}

// buildCitus configures, builds and installs Citus into stage (DESTDIR), without LLVM
// bitcode (which doubles the build) and without the optional curl and lz4 support.
func buildCitus(ctx context.Context, tarball, pgConfig, stage string, progress io.Writer) error {
	src, err := os.MkdirTemp("", "oncekit-citus-src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	_ = os.RemoveAll(stage)
	fmt.Fprintf(progress, "pgtest: building Citus from %s (about two minutes, once)\n", tarball)
	run := func(dir string, env []string, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, progress, progress
		cmd.Env = append(os.Environ(), env...)
		var tail tailWriter
		if progress == io.Discard {
			cmd.Stdout, cmd.Stderr = &tail, &tail
		}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("pgtest: building Citus: %s %s: %w\n%s", name, strings.Join(args, " "), err, tail.String())
		}
		return nil
	}
	if err := run(src, nil, "tar", "-xzf", tarball, "--strip-components=1"); err != nil {
		return err
	}
	env := []string{"PG_CONFIG=" + pgConfig}
	if err := run(src, env, "./configure", "--without-libcurl", "--without-lz4"); err != nil {
		return fmt.Errorf("%w\n(the build needs the apt packages postgresql-server-dev-<major> at the server's version, libzstd-dev and libkrb5-dev)", err)
	}
	if err := run(src, env, "make", "-j2", "with_llvm=no"); err != nil {
		return err
	}
	return run(src, env, "make", "install", "with_llvm=no", "DESTDIR="+stage)
}

// installCitus copies the staged library and extension files into the server's
// directories, skipping those already there with the same content.
func installCitus(stage, pkglib, share string) error {
	for _, dir := range []string{pkglib, filepath.Join(share, "extension")} {
		from := filepath.Join(stage, dir)
		err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			to := filepath.Join(dir, strings.TrimPrefix(p, from))
			want, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if have, err := os.ReadFile(to); err == nil && bytes.Equal(have, want) {
				return nil
			}
			if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(to+".tmp", want, 0o644); err != nil {
				return fmt.Errorf("pgtest: installing Citus into %s needs write access there (run as root): %w", dir, err)
			}
			return os.Rename(to+".tmp", to)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// StartCitus builds Citus when needed ([CitusTarball], [EnsureCitus]) and starts a
// coordinator and opts.Workers workers. It returns [ErrNoCitus] when no tarball is found.
func StartCitus(ctx context.Context, opts *CitusOpts) (*Citus, error) {
	o := CitusOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Workers == 0 {
		o.Workers = CitusWorkersDefault
	}
	if o.ShardCount == 0 {
		o.ShardCount = CitusShardCountDefault
	}
	tarball, err := CitusTarball()
	if err != nil {
		return nil, err
	}
	if err := EnsureCitus(ctx, tarball, o.Progress); err != nil {
		return nil, err
	}
	settings := map[string]string{
		"shared_preload_libraries":  "citus",
		"max_prepared_transactions": "200",
		"citus.shard_count":         strconv.Itoa(o.ShardCount),
		// The nodes reach each other on 127.0.0.1 without TLS.
		"citus.node_conninfo": "sslmode=disable",
	}
	c := &Citus{}
	for i := 0; i <= o.Workers; i++ {
		node, err := StartCluster(ctx, &ClusterOpts{Durable: o.Durable, Settings: settings, TCP: true})
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		if i == 0 {
			c.Coordinator = node
		} else {
			c.Workers = append(c.Workers, node)
		}
		if err := node.exec(ctx, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	if err := c.Coordinator.exec(ctx, "SELECT citus_set_coordinator_host('127.0.0.1', "+strconv.Itoa(c.Coordinator.port)+")"); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	for _, w := range c.Workers {
		if err := c.Coordinator.exec(ctx, "SELECT citus_add_node('127.0.0.1', "+strconv.Itoa(w.port)+")"); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	return c, nil
}

// ConnString is the coordinator's connection string.
func (c *Citus) ConnString() string { return c.Coordinator.ConnString() }

// Close stops every node and removes their directories.
func (c *Citus) Close() error {
	var errs []error
	for _, n := range append([]*Cluster{c.Coordinator}, c.Workers...) {
		if n != nil {
			errs = append(errs, n.Close())
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, c.ConnString())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", sql, err)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// tailWriter keeps the last 4 KiB written to it: a failed build's last words.
type tailWriter struct{ b []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return string(t.b) }

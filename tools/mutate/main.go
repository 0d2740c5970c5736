// Command mutate tests the history checkers: it applies each known-defect patch of
// internal/mutants to a copy of the tree, runs the checker the patch names on a few
// seeds, and fails if a checker passes with the defect in.
//
// Each seed runs the checker for -first (15s) and, when that run passes, again for the
// rest of the -budget (60s in all): most defects are caught in seconds, and the short
// run saves the rest of the budget. The checker prints when its first violation
// happened; the table reports it, counted from the start of the seed's first run.
//
//	go run ./tools/mutate [-seeds 1,2,3] [-budget 60s] [-only regexp]
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// mutant is one known-defect patch and the checker that must catch it.
type mutant struct {
	name, file, defect, pkg, test string
}

func main() {
	seeds := flag.String("seeds", "1,2,3", "comma-separated seeds, each run on every patch")
	budget := flag.Duration("budget", 60*time.Second, "how long a checker may take to catch a defect, per seed")
	firstRun := flag.Duration("first", 15*time.Second, "the length of the first, short run of each seed")
	only := flag.String("only", "", "run only the patches whose name matches this regexp")
	flag.Parse()
	if err := run(*seeds, *budget, *firstRun, *only); err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(1)
	}
}

func run(seedList string, budget, firstRun time.Duration, only string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	ms, err := mutants(filepath.Join(root, "internal", "mutants"))
	if err != nil {
		return err
	}
	var re *regexp.Regexp
	if only != "" {
		if re, err = regexp.Compile(only); err != nil {
			return err
		}
	}
	var seeds []string
	for _, s := range strings.Split(seedList, ",") {
		if s = strings.TrimSpace(s); s != "" {
			if _, err := strconv.ParseUint(s, 10, 64); err != nil {
				return fmt.Errorf("seed %q is not an unsigned integer", s)
			}
			seeds = append(seeds, s)
		}
	}
	files, err := treeFiles(root)
	if err != nil {
		return err
	}
	type row struct{ patch, seed, check, at, verdict string }
	var rows []row
	escaped := 0
	for _, m := range ms {
		if re != nil && !re.MatchString(m.name) {
			continue
		}
		fmt.Printf("mutate: %s: %s\n", m.name, m.defect)
		dir, bin, err := build(root, files, m)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		for _, seed := range seeds {
			r := row{patch: m.name, seed: seed, check: "-", at: "-", verdict: "PASSED: not caught"}
			// A short run, then the rest of the budget: the time to the first violation
			// counts the runs before the one that caught it.
			var spent time.Duration
			for _, d := range []time.Duration{min(firstRun, budget), budget - min(firstRun, budget)} {
				if d <= 0 {
					continue
				}
				res, err := runChecker(dir, bin, m, seed, d)
				if err != nil {
					os.RemoveAll(dir)
					return fmt.Errorf("%s, seed %s: %w", m.name, seed, err)
				}
				if res.caught {
					r.check, r.verdict = res.check, fmt.Sprintf("caught in the %s run", d)
					r.at = fmt.Sprintf("%.1fs", (spent + res.at).Seconds())
					break
				}
				spent += d
			}
			if strings.HasPrefix(r.verdict, "PASSED") {
				escaped++
			}
			fmt.Printf("mutate: %s seed %s: %s (check %q, first violation at %s)\n", m.name, seed, r.verdict, r.check, r.at)
			rows = append(rows, r)
		}
		os.RemoveAll(dir)
	}
	fmt.Println()
	fmt.Println("| patch | seed | first check broken | first violation at | verdict |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", r.patch, r.seed, r.check, r.at, r.verdict)
	}
	if escaped > 0 {
		return fmt.Errorf("%d runs of a checker passed with a known defect in", escaped)
	}
	return nil
}

// mutants reads the patches of dir. Each begins with lines "Defect:", "Package:" and
// "Test:" before the diff.
func mutants(dir string) ([]mutant, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.patch"))
	if err != nil {
		return nil, err
	}
	slices.Sort(paths)
	var ms []mutant
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		m := mutant{name: strings.TrimSuffix(filepath.Base(p), ".patch"), file: p}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ": ")
			if !ok {
				break
			}
			switch k {
			case "Defect":
				m.defect = v
			case "Package":
				m.pkg = v
			case "Test":
				m.test = v
			}
		}
		if m.pkg == "" || m.test == "" {
			return nil, fmt.Errorf("%s: no Package or Test line before the diff", p)
		}
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no patches in %s", dir)
	}
	return ms, nil
}

// treeFiles lists the tree's files as git sees them: tracked, and new ones not ignored.
func treeFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files, nil
}

// build copies the tree into a temporary directory, applies m's patch there and builds
// the checker's test binary. The working tree is never touched.
func build(root string, files []string, m mutant) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", "oncekit-mutant-")
	if err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	for _, f := range files {
		if err := copyFile(filepath.Join(root, f), filepath.Join(dir, f)); err != nil {
			return "", "", err
		}
	}
	apply := exec.Command("patch", "-p1", "--forward", "--batch", "-i", m.file)
	apply.Dir = dir
	if out, err := apply.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("the patch does not apply: %w\n%s", err, out)
	}
	bin = filepath.Join(dir, "mutant.test")
	gobuild := exec.Command("go", "test", "-c", "-race", "-trimpath", "-o", bin, m.pkg)
	gobuild.Dir = dir
	if out, err := gobuild.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("build the checker with the patch in: %w\n%s", err, out)
	}
	return dir, bin, nil
}

func copyFile(src, dst string) error {
	info, err := os.Lstat(src)
	if err != nil {
		if os.IsNotExist(err) {
			return nil // deleted in the working tree
		}
		return err
	}
	if !info.Mode().IsRegular() {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

type result struct {
	caught bool
	check  string
	at     time.Duration
}

var (
	brokenRe = regexp.MustCompile(`history: check "([^"]+)" broken \d+ times`)
	firstRe  = regexp.MustCompile(`history: first violation at ([0-9.]+s), check "([^"]+)"`)
)

// runChecker runs the checker for d on seed. A checker that fails without reporting a
// broken check went wrong itself: that is an error, not a catch.
func runChecker(dir, bin string, m mutant, seed string, d time.Duration) (result, error) {
	cmd := exec.Command(bin, "-test.run", m.test, "-test.count=1", "-test.v", "-test.timeout", (d + 10*time.Minute).String())
	cmd.Dir = filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(m.pkg, "./")))
	cmd.Env = append(os.Environ(), "ONCEKIT_SEED="+seed, "ONCEKIT_STRESS="+d.String())
	out, err := cmd.CombinedOutput()
	var res result
	if mm := firstRe.FindSubmatch(out); mm != nil {
		res.at, _ = time.ParseDuration(string(mm[1]))
		res.check = string(mm[2])
	}
	if mm := brokenRe.FindSubmatch(out); mm != nil {
		res.caught = true
		if res.check == "" {
			res.check = string(mm[1])
		}
	}
	if err != nil && !res.caught {
		tail := out
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return res, fmt.Errorf("the checker failed without a broken check: %w\n%s", err, tail)
	}
	if err == nil && res.caught {
		return res, fmt.Errorf("the checker reported a broken check and passed")
	}
	return res, nil
}

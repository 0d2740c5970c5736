package archtest

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The README and every guide under docs/ name only what exists. Each code span
// (`...`) is read for:
//
//   - Go identifiers: package-qualified (`ledger.DoOpts.Mode`, `(*ledger.Ledger).Do`,
//     `keys.Business(...)`), checked in the package the name means (see candidates:
//     oncekit's package first, then Temporal's of the same name, then any package the
//     module's Go files import under that name, such as tworker or client; a name that
//     means no package, such as the variable in `call.DownstreamKey`, is not checked);
//     unqualified `Type.Member` (`DoOpts.Mode`), which some package oncekit has or
//     imports must declare; and a span that is a lone CamelCase name (`DoTx`), which must
//     be declared somewhere there, as an identifier or as a field or method. A call must
//     call a function or a type, and a call written where one value is expected
//     (`Opts.Key = keys.Business(...)`) must return one value.
//   - Commands: `make TARGET` against the Makefile's targets; `oncekit SUBCOMMAND
//     --flag` against cmd/oncekit/usage.txt, which lists every command and flag of the
//     command as its --help describes them (a test of the command keeps it current); the
//     package directories of `go run`, `go test`, `go build` and `go install`, and any
//     github.com/oncekit/oncekit/... path. A directory that is a module of its own, such
//     as cmd/oncekit, is no package of this module: `go run ./cmd/oncekit` from the root
//     is refused.
//
// Fenced blocks that are not Go are read for commands too: in a block with "$ "
// prompts, the prompted lines (the rest is output); in one without, every line. Go
// blocks are the examples' code, checked by TestReadmeSnippetsAreExamples. Relative
// links must point to a file or directory that exists, and an #anchor to a heading of
// the linked Markdown file.
func TestMarkdownNamesExist(t *testing.T) {
	t.Parallel()
	m := loadModule(t)
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(m.root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && path == filepath.Join(m.root, "docs") {
				return filepath.SkipDir // no guides yet
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(m.root, path)
			files = append(files, rel)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	targets := makeTargets(t, filepath.Join(m.root, "Makefile"))
	cli := oncekitUsage(t, filepath.Join(m.root, "cmd", "oncekit", "usage.txt"))
	c := &docChecker{m: m, targets: targets, cli: cli, headings: map[string]map[string]bool{}}
	for _, name := range files {
		t.Run(strings.TrimSuffix(filepath.ToSlash(name), ".md"), func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(m.root, name))
			if err != nil {
				t.Fatal(err)
			}
			doc := parseMarkdown(string(src))
			for _, s := range doc.spans {
				for _, err := range c.span(s.text) {
					t.Errorf("%s:%d: `%s`: %v", name, s.line, s.text, err)
				}
			}
			for _, cmd := range doc.commands {
				for _, err := range c.command(cmd.text) {
					t.Errorf("%s:%d: %s: %v", name, cmd.line, cmd.text, err)
				}
			}
			for _, l := range doc.links {
				if err := c.link(name, l.text); err != nil {
					t.Errorf("%s:%d: link %s: %v", name, l.line, l.text, err)
				}
			}
			t.Logf("%s: %d code spans, %d commands, %d links", name, len(doc.spans), len(doc.commands), len(doc.links))
		})
	}
}

// The patterns the Markdown reader and the command checks use.
var (
	reSeparator  = regexp.MustCompile(`;|&&|\|\|?`)
	reAssignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)
	reTarget     = regexp.MustCompile(`^[a-z][a-z0-9_.-]*$`)
	reModulePath = regexp.MustCompile(`github\.com/oncekit/oncekit(/[\w./-]*[\w])?`)
	reURL        = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
	reQuoted     = regexp.MustCompile(`"[^"]*"|'[^']*'`)
	reFence      = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})\\s*(\\S*)")
	reHeading    = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
	reLink       = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	reLinkDef    = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s+(\S+)`)
	reLinkText   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	reWord       = regexp.MustCompile(`^[a-z]+$`)
)

// docChecker checks what a Markdown file names.
type docChecker struct {
	m        *module
	targets  map[string]bool
	cli      *usage
	headings map[string]map[string]bool // anchors by Markdown file
}

// span checks a code span's identifiers and commands.
func (c *docChecker) span(text string) []error {
	var errs []error
	lone := loneName.MatchString(text)
	for _, mn := range scanMentions(text, false) {
		var err error
		switch {
		case mn.pkg != "":
			_, err = c.m.checkQualified(mn, c.m.candidates(mn.pkg))
		case len(mn.names) > 1 || lone:
			err = c.m.checkUnqualified(mn)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return append(errs, c.command(text)...)
}

// loneName matches a code span that is one CamelCase name, such as `DoTx`, or its
// call, such as `CrashAt(name, point)`: two capitals at least, so that words such as
// `Location` (a header) are not taken for identifiers.
var loneName = regexp.MustCompile(`^\*?\p{Lu}[\p{Ll}\pN]+\p{Lu}[\pL\pN]*(\(.*\))?$`)

// command checks the commands in a line: each of its parts separated by ;, &&, || or
// |, after any environment assignments, that runs make, oncekit or go.
func (c *docChecker) command(line string) []error {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i] // a comment
	}
	var errs []error
	for _, part := range reSeparator.Split(line, -1) {
		words := strings.Fields(unquote(part))
		for len(words) > 0 && reAssignment.MatchString(words[0]) {
			words = words[1:]
		}
		if len(words) == 0 {
			continue
		}
		switch {
		case words[0] == "make":
			for _, w := range words[1:] {
				if strings.Contains(w, "=") || strings.HasPrefix(w, "-") {
					continue
				}
				if !reTarget.MatchString(w) {
					break
				}
				if !c.targets[w] {
					errs = append(errs, fmt.Errorf("the Makefile has no target %q (make help lists them)", w))
				}
			}
		case words[0] == "oncekit" || words[0] == "./bin/oncekit":
			errs = append(errs, c.cli.check(words[1:])...)
		case words[0] == "go" && len(words) > 1:
			errs = append(errs, c.goCommand(words[1:])...)
		}
	}
	for _, p := range reModulePath.FindAllStringSubmatch(line, -1) {
		if err := c.packageDir(strings.TrimSuffix(p[1], "/...")); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// goCommand checks the package directories a go command names: each must be a package
// of the module the command runs in (the root's, or with -C the module in that
// directory), not one inside a module of its own.
func (c *docChecker) goCommand(args []string) []error {
	switch args[0] {
	case "run", "test", "build", "install", "vet":
	default:
		return nil
	}
	base := "."
	rest := args[1:]
	if len(rest) >= 2 && rest[0] == "-C" {
		base, rest = "./"+strings.TrimPrefix(rest[1], "./"), rest[2:]
	}
	var errs []error
	for _, a := range rest {
		if !strings.HasPrefix(a, "./") {
			continue
		}
		dir := path.Join(base, strings.TrimSuffix(strings.TrimSuffix(a, "/..."), "/"))
		if err := c.packageDir(strings.TrimPrefix("/"+dir, "/.")); err != nil {
			errs = append(errs, err)
		}
		if mod := c.moduleOf(dir); mod != path.Clean(base) {
			errs = append(errs, fmt.Errorf("%s is in the module at %s: go %s cannot reach it from %s (use go %s -C %s, or make)", dir, mod, args[0], base, args[0], mod))
		}
		if args[0] == "run" {
			break // what follows is the program's arguments
		}
	}
	return errs
}

// moduleOf returns the directory of the module that holds dir, both relative to the
// root: the nearest directory at or above dir with a go.mod.
func (c *docChecker) moduleOf(dir string) string {
	for d := path.Clean(dir); d != "." && d != "/"; d = path.Dir(d) {
		if _, err := os.Stat(filepath.Join(c.m.root, filepath.FromSlash(d), "go.mod")); err == nil {
			return d
		}
	}
	return "."
}

// packageDir checks that rel, a path in the module such as /cmd/oncekit, is a
// directory with Go files.
func (c *docChecker) packageDir(rel string) error {
	if rel == "" {
		return nil
	}
	dir := filepath.Join(c.m.root, filepath.FromSlash(rel))
	goFiles, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	if len(goFiles) == 0 {
		return fmt.Errorf("the module has no package at .%s", rel)
	}
	return nil
}

// link checks a relative link of the Markdown file name.
func (c *docChecker) link(name, target string) error {
	if reURL.MatchString(target) {
		return nil // a URL
	}
	file, anchor, _ := strings.Cut(target, "#")
	path := name
	if file != "" {
		path = filepath.Join(filepath.Dir(name), filepath.FromSlash(file))
		if _, err := os.Stat(filepath.Join(c.m.root, path)); err != nil {
			return fmt.Errorf("%s does not exist", filepath.ToSlash(path))
		}
	}
	if anchor == "" || !strings.HasSuffix(path, ".md") {
		return nil
	}
	anchors, ok := c.headings[path]
	if !ok {
		src, err := os.ReadFile(filepath.Join(c.m.root, path))
		if err != nil {
			return err
		}
		anchors = parseMarkdown(string(src)).anchors
		c.headings[path] = anchors
	}
	if !anchors[anchor] {
		return fmt.Errorf("%s has no heading #%s", filepath.ToSlash(path), anchor)
	}
	return nil
}

// unquote replaces the quoted parts of a shell line with a placeholder, so that
// DEMO_FLAGS="-orders 100" stays one word.
func unquote(s string) string {
	return reQuoted.ReplaceAllString(s, "Q")
}

// markdown is what the checks read in a Markdown file.
type markdown struct {
	spans    []located // code spans
	commands []located // lines of fenced blocks that are not Go
	links    []located // link targets
	anchors  map[string]bool
}

type located struct {
	line int
	text string
}

// parseMarkdown reads a Markdown file as GitHub renders it, as far as the checks need:
// fenced blocks, code spans (which may continue over the lines of a paragraph), link
// targets outside code, and the anchors of its headings.
func parseMarkdown(src string) *markdown {
	md := &markdown{anchors: map[string]bool{}}
	lines := strings.Split(src, "\n")
	var para []string
	paraLine := 0
	flush := func() {
		md.inline(strings.Join(para, "\n"), paraLine)
		para = nil
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if f := reFence.FindStringSubmatch(line); f != nil {
			flush()
			var block []located
			j := i + 1
			for ; j < len(lines); j++ {
				if strings.HasPrefix(strings.TrimSpace(lines[j]), f[1]) {
					break
				}
				block = append(block, located{j + 1, lines[j]})
			}
			if f[2] != "go" {
				md.commands = append(md.commands, shellLines(block)...)
			}
			i = j
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if h := reHeading.FindStringSubmatch(line); h != nil {
			flush()
			md.heading(h[1])
			md.inline(h[1], i+1)
			continue
		}
		if len(para) == 0 {
			paraLine = i + 1
		}
		para = append(para, line)
	}
	flush()
	return md
}

// shellLines returns the lines of a fenced block to check as commands: the prompted
// ones, without their prompt, when the block has prompts; all of them otherwise.
func shellLines(block []located) []located {
	var prompted []located
	for _, l := range block {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l.text), "$ "); ok {
			prompted = append(prompted, located{l.line, rest})
		}
	}
	if prompted != nil {
		return prompted
	}
	return block
}

// inline reads the code spans and link targets of a paragraph that starts at line.
func (md *markdown) inline(p string, line int) {
	var plain strings.Builder // the paragraph without its code spans
	for i := 0; i < len(p); {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			plain.WriteString(p[i : i+2])
			i += 2
			continue
		case p[i] != '`':
			plain.WriteByte(p[i])
			i++
			continue
		}
		n := 0
		for i+n < len(p) && p[i+n] == '`' {
			n++
		}
		end := closingRun(p, i+n, n)
		if end < 0 {
			plain.WriteString(p[i : i+n])
			i += n
			continue
		}
		text := strings.ReplaceAll(p[i+n:end], "\n", " ")
		if len(text) > 2 && text[0] == ' ' && text[len(text)-1] == ' ' {
			text = text[1 : len(text)-1]
		}
		md.spans = append(md.spans, located{line + strings.Count(p[:i], "\n"), text})
		plain.WriteString(strings.Repeat(" ", end+n-i-strings.Count(p[i:end+n], "\n")) + strings.Repeat("\n", strings.Count(p[i:end+n], "\n")))
		i = end + n
	}
	text := plain.String()
	for _, l := range reLink.FindAllStringSubmatchIndex(text, -1) {
		md.links = append(md.links, located{line + strings.Count(text[:l[0]], "\n"), text[l[2]:l[3]]})
	}
	for _, l := range reLinkDef.FindAllStringSubmatchIndex(text, -1) {
		md.links = append(md.links, located{line + strings.Count(text[:l[0]], "\n"), text[l[2]:l[3]]})
	}
}

// closingRun returns the index of the next run of exactly n backticks from i, or -1.
func closingRun(p string, i, n int) int {
	for i < len(p) {
		if p[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(p) && p[j] == '`' {
			j++
		}
		if j-i == n {
			return i
		}
		i = j
	}
	return -1
}

// heading records the anchor GitHub gives a heading: its text without markup, lower
// case, with spaces turned into hyphens and other punctuation dropped; a repeated
// anchor gets -1, -2, ...
func (md *markdown) heading(text string) {
	text = reLinkText.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	anchor := b.String()
	for n := 1; md.anchors[anchor]; n++ {
		anchor = b.String() + "-" + strconv.Itoa(n)
	}
	md.anchors[anchor] = true
}

// makeTargets returns the targets of the Makefile at path.
func makeTargets(t *testing.T, path string) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	rule := regexp.MustCompile(`^([A-Za-z0-9_][A-Za-z0-9_.-]*(?:\s+[A-Za-z0-9_][A-Za-z0-9_.-]*)*)\s*:([^=]|$)`)
	for _, line := range strings.Split(string(src), "\n") {
		if r := rule.FindStringSubmatch(line); r != nil {
			for _, name := range strings.Fields(r[1]) {
				targets[name] = true
			}
		}
	}
	if !targets["help"] {
		t.Fatalf("%s: no help target found: the Makefile's rules are not where the check looks", path)
	}
	return targets
}

// usage is what the oncekit command accepts, as its usage text says.
type usage struct {
	commands map[string]map[string]bool // flags by command ("outbox dead")
	global   map[string]bool
}

// oncekitUsage reads the usage text of the oncekit command, the file path: each line
// under "commands:" starts with a command (one or two lower-case words) and lists its
// flags; the line "every command:" lists the flags all take.
func oncekitUsage(t *testing.T, path string) *usage {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: the check reads the subcommands from it (go test -run UsageFile in cmd/oncekit writes it)", err)
	}
	text := string(src)
	u := &usage{commands: map[string]map[string]bool{}, global: map[string]bool{"help": true, "h": true}}
	flag := regexp.MustCompile(`--?([a-z][a-z0-9-]*)`)
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case line == "commands:":
			in = true
		case strings.HasPrefix(line, "every command:"):
			for _, f := range flag.FindAllStringSubmatch(line, -1) {
				u.global[f[1]] = true
			}
		case in && strings.HasPrefix(line, "  "):
			syntax, _, _ := strings.Cut(strings.TrimSpace(line), "   ") // the description follows
			words := strings.Fields(syntax)
			name := words[0]
			if len(words) > 1 && reWord.MatchString(words[1]) {
				name += " " + words[1]
			}
			flags := map[string]bool{}
			for _, f := range flag.FindAllStringSubmatch(syntax, -1) {
				flags[f[1]] = true
			}
			u.commands[name] = flags
		default:
			in = false
		}
	}
	if len(u.commands) == 0 {
		t.Fatalf("%s: no command found under \"commands:\" in the usage text", path)
	}
	return u
}

// check checks the arguments of an oncekit command line: the subcommand and its flags.
// A placeholder in capitals (COMMAND) and arguments the usage text shows in brackets
// are read as written there.
func (u *usage) check(args []string) []error {
	var words []string
	for _, a := range args {
		a = strings.Trim(a, "[]`,.:;()")
		if a != "" {
			words = append(words, a)
		}
	}
	if len(words) == 0 {
		return nil
	}
	var flags map[string]bool
	rest := words
	if w := words[0]; reWord.MatchString(w) {
		name := w
		if len(words) > 1 {
			if _, ok := u.commands[w+" "+words[1]]; ok {
				name = w + " " + words[1]
			}
		}
		var ok bool
		if flags, ok = u.commands[name]; !ok {
			var sub []string
			for c := range u.commands {
				if strings.HasPrefix(c, name+" ") {
					sub = append(sub, strings.TrimPrefix(c, name+" "))
				}
			}
			if len(sub) == 0 && name != "help" {
				return []error{fmt.Errorf("oncekit has no command %q (oncekit --help lists them)", name)}
			}
			if len(words) > 1 && reWord.MatchString(words[1]) {
				sort.Strings(sub)
				return []error{fmt.Errorf("oncekit %s has no subcommand %q: only %s", name, words[1], strings.Join(sub, ", "))}
			}
		}
		rest = words[len(strings.Fields(name)):]
	}
	var errs []error
	for _, w := range rest {
		if !strings.HasPrefix(w, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if !flags[name] && !u.global[name] {
			errs = append(errs, fmt.Errorf("oncekit %s takes no flag --%s", words[0], name))
		}
	}
	return errs
}

package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// marker names the file whose code a Markdown snippet shows; wholeMarker names the file
// a snippet shows whole, byte for byte.
var (
	marker      = regexp.MustCompile(`^<!-- example: (\S+) -->$`)
	wholeMarker = regexp.MustCompile(`^<!-- file: (\S+) -->$`)
)

// The Go snippets of the README and of every guide in docs/ are the examples' code,
// compiled and run by go test: every snippet is preceded by a marker naming its file
// (relative to the repository's root), and every line of the snippet appears in that
// file, in the same order (the snippet may leave lines out, such as error handling, but
// may not change one). A snippet preceded by <!-- file: path --> instead is that whole
// file, unchanged, such as the README's quick start, which a user copies as it is.
func TestReadmeSnippetsAreExamples(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, g := range guides {
		rel, err := filepath.Rel(root, g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	for _, name := range files {
		t.Run(strings.TrimSuffix(name, ".md"), func(t *testing.T) {
			t.Parallel()
			src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
			if err != nil {
				t.Fatal(err)
			}
			n := checkSnippets(t, root, name, string(src))
			if name == "README.md" && n == 0 {
				t.Fatal("no Go snippet found in README.md")
			}
		})
	}
}

// checkSnippets checks the Go snippets of the Markdown file name, whose text is src,
// against the files their markers name, and returns how many it found.
func checkSnippets(t *testing.T, root, name, src string) int {
	t.Helper()
	lines := strings.Split(src, "\n")
	snippets := 0
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```go" {
			continue
		}
		snippets++
		start := i + 1
		end := start
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		i = end
		m := []string(nil)
		if start >= 2 {
			if w := wholeMarker.FindStringSubmatch(lines[start-2]); w != nil {
				checkWhole(t, root, name, start, w[1], lines[start:end])
				continue
			}
			m = marker.FindStringSubmatch(lines[start-2])
		}
		if m == nil {
			t.Errorf("%s:%d: a Go snippet without an <!-- example: file --> marker on the line before it", name, start)
			continue
		}
		code, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m[1])))
		if err != nil {
			t.Errorf("%s:%d: %v", name, start, err)
			continue
		}
		if n, ok := snippetIn(lines[start:end], strings.Split(string(code), "\n")); !ok {
			t.Errorf("%s:%d: %q is not in %s (after the snippet's previous line)", name, start+n+1, strings.TrimSpace(lines[start+n]), m[1])
		}
	}
	return snippets
}

// checkWhole checks that snippet, at line start of the Markdown file name, is the file
// path of the repository, whole.
func checkWhole(t *testing.T, root, name string, start int, path string, snippet []string) {
	t.Helper()
	code, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		t.Errorf("%s:%d: %v", name, start, err)
		return
	}
	want := strings.Split(strings.TrimSuffix(string(code), "\n"), "\n")
	for i := 0; i < len(want) || i < len(snippet); i++ {
		switch {
		case i >= len(snippet):
			t.Errorf("%s:%d: the snippet ends before %s does (its line %d: %q)", name, start+i+1, path, i+1, want[i])
		case i >= len(want):
			t.Errorf("%s:%d: the snippet goes on after %s ends: %q", name, start+i+1, path, snippet[i])
		case snippet[i] != want[i]:
			t.Errorf("%s:%d: %q differs from line %d of %s: %q", name, start+i+1, snippet[i], i+1, path, want[i])
		default:
			continue
		}
		return
	}
}

// snippetIn reports whether every line of snippet appears in code, in order, ignoring
// indentation and blank lines; when one does not, it returns that line's index in snippet.
func snippetIn(snippet, code []string) (int, bool) {
	at := 0
	for n, line := range snippet {
		want := strings.TrimSpace(line)
		if want == "" {
			continue
		}
		for at < len(code) && strings.TrimSpace(code[at]) != want {
			at++
		}
		if at == len(code) {
			return n, false
		}
		at++
	}
	return 0, true
}

// The snippet check accepts a snippet that leaves lines out, and refuses one that changes
// a line or reorders two.
func TestSnippetIn(t *testing.T) {
	t.Parallel()
	code := strings.Split("func f() {\n\ta := 1\n\tif a > 0 {\n\t\treturn\n\t}\n\tb := 2\n}", "\n")
	for _, tc := range []struct {
		name    string
		snippet string
		ok      bool
		at      int
	}{
		{"Whole", "func f() {\n\ta := 1\n\tif a > 0 {\n\t\treturn\n\t}\n\tb := 2\n}", true, 0},
		{"LinesLeftOut", "a := 1\n\nb := 2", true, 0},
		{"IndentationIgnored", "    a := 1\nb := 2", true, 0},
		{"ChangedLine", "a := 1\nb := 3", false, 1},
		{"Reordered", "b := 2\na := 1", false, 1},
		{"Missing", "c := 3", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			at, ok := snippetIn(strings.Split(tc.snippet, "\n"), code)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.at, at)
		})
	}
}

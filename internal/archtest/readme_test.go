package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// marker names the file whose code a README snippet shows.
var marker = regexp.MustCompile(`^<!-- example: (\S+) -->$`)

// The README's Go snippets are the examples' code, compiled and run by go test: every
// snippet is preceded by a marker naming its file, and every line of the snippet appears
// in that file, in the same order (the snippet may leave lines out, such as error
// handling, but may not change one).
func TestReadmeSnippetsAreExamples(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
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
			m = marker.FindStringSubmatch(lines[start-2])
		}
		if m == nil {
			t.Errorf("README.md:%d: a Go snippet without an <!-- example: file --> marker on the line before it", start)
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, m[1]))
		if err != nil {
			t.Errorf("README.md:%d: %v", start, err)
			continue
		}
		code := strings.Split(string(src), "\n")
		at := 0
		for n, line := range lines[start:end] {
			want := strings.TrimSpace(line)
			if want == "" {
				continue
			}
			for at < len(code) && strings.TrimSpace(code[at]) != want {
				at++
			}
			if at == len(code) {
				t.Errorf("README.md:%d: %q is not in %s (after the snippet's previous line)", start+n+1, want, m[1])
				break
			}
			at++
		}
	}
	if snippets == 0 {
		t.Fatal("no Go snippet found in README.md")
	}
}

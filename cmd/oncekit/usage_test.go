package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// usageFile lists every command and flag of oncekit, one command a line, as its help
// shows them: the documentation checks (internal/archtest) read it to check every
// "oncekit COMMAND --flag" the README and docs/ mention.
const usageFile = "usage.txt"

// reference writes the usage file's text from the command tree.
func reference(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString("usage: oncekit COMMAND [flags] [args]\n\n")
	b.WriteString("This file is written by TestUsageFileIsCurrent (ONCEKIT_UPDATE_USAGE=1 go test -run UsageFile):\n")
	b.WriteString("every command and its flags, as oncekit COMMAND --help describes them.\n\ncommands:\n")
	var lines []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			syntax := strings.TrimPrefix(sub.CommandPath(), "oncekit ")
			if _, argsUse, ok := strings.Cut(sub.Use, " "); ok {
				syntax += " " + argsUse
			}
			sub.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
				name := "--" + f.Name
				if f.Shorthand != "" {
					name = "-" + f.Shorthand + "|--" + f.Name
				}
				if f.Value.Type() != "bool" {
					name += " " + strings.ToUpper(f.Value.Type())
				}
				syntax += " [" + name + "]"
			})
			lines = append(lines, fmt.Sprintf("  %s   %s", syntax, sub.Short))
			walk(sub)
		}
	}
	walk(root)
	slices.Sort(lines)
	b.WriteString(strings.Join(lines, "\n"))
	var global []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { global = append(global, "--"+f.Name) })
	fmt.Fprintf(&b, "\n\nevery command: %s, -h|--help; oncekit alone: --version\n", strings.Join(global, ", "))
	return b.String()
}

// The usage file the documentation checks read says what the command accepts.
func TestUsageFileIsCurrent(t *testing.T) {
	t.Parallel()
	root := (&app{}).rootCommand()
	root.InitDefaultCompletionCmd()
	want := reference(root)
	if os.Getenv("ONCEKIT_UPDATE_USAGE") == "1" {
		require.NoError(t, os.WriteFile(usageFile, []byte(want), 0o644))
	}
	got, err := os.ReadFile(usageFile)
	require.NoError(t, err)
	require.Equal(t, want, string(got), "%s is stale: ONCEKIT_UPDATE_USAGE=1 go test -run UsageFile rewrites it", usageFile)
}

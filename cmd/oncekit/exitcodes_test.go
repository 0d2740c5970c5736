package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A release of a record that is not pending, or an eviction of one that is, exits 6, not
// 3: the record exists. A key with no record exits 3.
func TestExitCodes_WrongState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.claim(t, "acme", "payments.charge", "c-1", time.Hour)

	r := b.run(t, "release", "acme", "orders.create", "o-1", "-y", "--reason", "INC-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	require.Contains(t, r.errOut, "is completed")
	r = b.run(t, "evict", "acme", "payments.charge", "c-1", "-y", "--reason", "INC-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	require.Contains(t, r.errOut, "is pending")
	r = b.run(t, "release", "acme", "orders.create", "no-such-key", "-y", "--reason", "INC-1")
	require.Equal(t, exitNotFound, r.code, r.errOut)
}

// Every error goes to stderr on one line starting with "oncekit:"; a usage error's line
// ends with the help to read. The refusals a plan explains are on stdout.
func TestErrors_OneLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.claim(t, "acme", "payments.charge", "live", time.Hour)
	for _, tc := range []struct {
		args  []string
		code  int
		usage bool
	}{
		{[]string{"inspect", "acme", "orders.create", "missing"}, exitNotFound, false},
		{[]string{"release", "acme", "orders.create", "o-1", "-y", "--reason", "x"}, exitWrongState, false},
		{[]string{"release", "acme", "payments.charge", "live", "-y", "--reason", "x"}, exitRefused, false},
		{[]string{"evict", "acme", "orders.create", "o-1"}, exitRefused, false},
		{[]string{"outbox", "inspect", "0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44"}, exitNotFound, false},
		{[]string{"list", "--limit", "0"}, exitUsage, true},
		{[]string{"no-such-command"}, exitUsage, true},
	} {
		r := b.run(t, tc.args...)
		require.Equal(t, tc.code, r.code, "%v: %s", tc.args, r.errOut)
		lines := strings.Split(strings.TrimSuffix(r.errOut, "\n"), "\n")
		require.True(t, strings.HasPrefix(lines[0], "oncekit: "), "%v: %q", tc.args, r.errOut)
		require.Len(t, lines, 1, "%v: %q", tc.args, r.errOut)
		if tc.usage {
			require.Regexp(t, `\(oncekit( \S+)* --help describes the command and its flags\)$`, lines[0])
		}
	}
}

// The limits the operating guide states are the command's.
func TestDocClaims_Command(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("`--limit` takes 1 to (\\d+)").FindSubmatch(guide)
	require.NotNil(t, m, "docs/operating.md no longer states --limit's range")
	require.Equal(t, strconv.Itoa(maxListLimit), string(m[1]))
}

package archtest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/policy"
	"github.com/oncekit/oncekit/saga"
	"github.com/oncekit/oncekit/webhook"
	"github.com/oncekit/oncekit/worker"
)

// claim is a value a guide states: where (a file and a regular expression whose first
// group is the stated value, as the guide writes it) and what the code says it is.
type claim struct {
	file string
	re   string
	// want is a time.Duration (the text is "30 s", "five minutes", "24-hour", "7 days"),
	// a size in bytes (an int with a unit in the text: "2,048 bytes", "1 MiB"), a count
	// (an int without a unit: "10", "eight") or a string, stated as it is.
	want any
}

// claims lists the defaults, limits and counts the guides state; each is read from
// the code, so that changing one in the code without the guide, or the guide without
// the code, fails here. Exit codes and the command's limits are checked beside the
// command (cmd/oncekit, a module of its own); error texts beside the code that makes
// them (ledger's TestIntent_FingerprintRequired reads the ledger guide's).
var claims = []claim{
	{"docs/activities.md", "`activity.WaitDefault` \\(([^;)]+)", activity.WaitDefault},
	{"docs/activities.md", "`worker.TenantDefault`, \"([^\"]+)\"", worker.TenantDefault},
	{"docs/ledger.md", "`ledger.RetentionDefault`, ([^;)]+)", ledger.RetentionDefault},
	{"docs/ledger.md", "`ledger.MaxKeyLenLimit` \\(([\\d,]+ bytes)", ledger.MaxKeyLenLimit},
	{"docs/ledger.md", "`ledger.LeaseDefault` of ([a-z0-9 ]+?)\\)", ledger.LeaseDefault},
	{"docs/ledger.md", "`ledger.SchemaDefault`, `([^`]+)`", ledger.SchemaDefault},
	{"docs/messaging.md", "`inbox.RetentionDefault`, ([^)]+)\\)", inbox.RetentionDefault},
	{"docs/messaging.md", "`outbox.PublishedRetentionDefault`, ([^)]+)\\)", outbox.PublishedRetentionDefault},
	{"docs/messaging.md", "`DispatcherConfig.MaxAttempts`, (\\d+)\\)", outbox.MaxAttemptsDefault},
	{"docs/sagas.md", "`saga.LeaseDefault`, ([^)]+?)\\)", saga.LeaseDefault},
	{"docs/sagas.md", "([a-z]+) attempts\\s+\\(`policy.StepMaxAttemptsDefault`\\)", policy.StepMaxAttemptsDefault},
	{"docs/sagas.md", "backoff capped at (a [a-z]+) under", policy.MaxIntervalDefault},
	{"docs/sagas.md", "under a (\\d+-hour) deadline", policy.CompensationDeadlineDefault},
	{"docs/http.md", "`Config.MaxBodyBytes` \\((\\d+ [KM]iB)", idempotency.MaxBodyDefault},
	{"docs/http.md", "`keys.MaxJSONDepth` \\((\\d+)\\)", keys.MaxJSONDepth},
	{"docs/http.md", "`Config.MaxResponseBytes` \\((\\d+ [KM]iB)", idempotency.MaxResponseDefault},
	{"docs/webhooks.md", "`Config.MaxBodyBytes` \\((\\d+ [KM]iB)\\)", webhook.MaxBodyDefault},
	{"docs/webhooks.md", "`Config.MaxConcurrentReads` read slots \\((\\d+)\\)", webhook.MaxConcurrentReadsDefault},
	{"docs/webhooks.md", "\\((\\d+ [KM]iB) by default\\)", webhook.MaxConcurrentReadsDefault * webhook.MaxBodyDefault},
	{"docs/webhooks.md", "`Config.ReadSlotWait` \\(([^)]+)\\)", webhook.ReadSlotWaitDefault},
	{"docs/webhooks.md", "`Config.BodyReadTimeout` \\(([^)]+)\\)", webhook.BodyReadTimeoutDefault},
	// What idempotency.StoreDefault refuses, found by running it.
	{"docs/http.md", "\\*\\*Not stored\\*\\*: ([^(]+) \\(`idempotency.StoreDefault`\\)", notStored()},
	// The transcript's migrations, which a new migration file changes.
	{"docs/operating.md", "migrations  (ledger \\d+, webhook \\d+, inbox \\d+, outbox \\d+)\n", fmt.Sprintf("ledger %d, webhook %d, inbox %d, outbox %d",
		count(ledger.Migrations()), count(webhook.Migrations()), count(inbox.Migrations()), count(outbox.Migrations()))},
}

// notStored describes the final statuses idempotency.StoreDefault does not store, as
// docs/http.md words it: "5xx and 408, 409" when every 5xx and those 4xx are refused.
func notStored() string {
	var refused []string
	all5xx := true
	for status := 200; status < 600; status++ {
		switch stored := idempotency.StoreDefault(status); {
		case status >= 500:
			all5xx = all5xx && !stored
		case !stored:
			refused = append(refused, strconv.Itoa(status))
		}
	}
	if !all5xx {
		return "some 5xx are stored"
	}
	return "5xx and " + strings.Join(refused, ", ")
}

// count returns the number of SQL files of a migration line.
func count(fsys fs.FS) int {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		panic(err)
	}
	return len(files)
}

func TestDocClaims(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	for _, c := range claims {
		name := strings.TrimSuffix(filepath.Base(c.file), ".md")
		if m := regexp.MustCompile("`([A-Za-z.]+)`").FindStringSubmatch(c.re); m != nil {
			name += "/" + m[1]
		}
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(c.file)))
			require.NoError(t, err)
			m := regexp.MustCompile(c.re).FindSubmatch(src)
			require.NotNil(t, m, "%s no longer states what %q finds: update the guide or this claim", c.file, c.re)
			text := strings.Join(strings.Fields(string(m[1])), " ")
			got, err := stated(text, c.want)
			require.NoError(t, err, "%s: %q", c.file, text)
			require.Equal(t, c.want, got, "%s states %q where the code says %v", c.file, text, c.want)
		})
	}
}

// numbers are the number words the guides use.
var numbers = map[string]int{"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
	"seven": 7, "eight": 8, "nine": 9, "ten": 10}

// stated reads text as a value of the kind of like.
func stated(text string, like any) (any, error) {
	switch like.(type) {
	case string:
		return text, nil
	case time.Duration:
		return statedDuration(text)
	case int:
		n, unit, _ := strings.Cut(text, " ")
		v, err := statedInt(n)
		if err != nil {
			return nil, err
		}
		switch unit {
		case "", "bytes":
			return v, nil
		case "KiB":
			return v << 10, nil
		case "MiB":
			return v << 20, nil
		}
		return nil, fmt.Errorf("unknown unit %q", unit)
	}
	return nil, fmt.Errorf("no reader for %T", like)
}

func statedInt(s string) (int, error) {
	if n, ok := numbers[s]; ok {
		return n, nil
	}
	return strconv.Atoi(strings.ReplaceAll(s, ",", ""))
}

// statedDuration reads "30 s", "five minutes", "24 hours", "24-hour", "7 days", "a minute".
func statedDuration(text string) (time.Duration, error) {
	n, unit, ok := strings.Cut(strings.Replace(text, "-", " ", 1), " ")
	if !ok {
		return 0, fmt.Errorf("no unit in %q", text)
	}
	v, err := statedInt(n)
	if err != nil {
		return 0, err
	}
	units := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "second": time.Second, "minute": time.Minute,
		"hour": time.Hour, "day": 24 * time.Hour}
	u, ok := units[strings.TrimSuffix(unit, "s")]
	if !ok {
		u, ok = units[unit]
	}
	if !ok {
		return 0, fmt.Errorf("unknown unit %q", unit)
	}
	return time.Duration(v) * u, nil
}

// The readers of stated values read what the guides write, and refuse what they cannot.
func TestStated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text string
		like any
		want any
	}{
		{"30 s", time.Duration(0), 30 * time.Second},
		{"five minutes", time.Duration(0), 5 * time.Minute},
		{"a minute", time.Duration(0), time.Minute},
		{"24-hour", time.Duration(0), 24 * time.Hour},
		{"30 days", time.Duration(0), 30 * 24 * time.Hour},
		{"2,048 bytes", 0, 2048},
		{"256 KiB", 0, 256 << 10},
		{"25 MiB", 0, 25 << 20},
		{"eight", 0, 8},
		{"oncekit", "", "oncekit"},
	} {
		got, err := stated(tc.text, tc.like)
		require.NoError(t, err, tc.text)
		require.Equal(t, tc.want, got, tc.text)
	}
	for _, bad := range []struct {
		text string
		like any
	}{{"30", time.Duration(0)}, {"30 fortnights", time.Duration(0)}, {"1 GiB", 0}, {"many", 0}} {
		_, err := stated(bad.text, bad.like)
		require.Error(t, err, bad.text)
	}
}

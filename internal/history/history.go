// Package history supports seeded, randomized history tests: many clients issue
// operations against a real database while faults are injected, every call, fn start and
// committed effect is recorded, and checks run over the whole history at the end.
//
// A run is driven by a seed. The seed decides each client's operations, keys and faults,
// so a failing seed replays the same plan; the interleaving is the scheduler's. When a
// test fails, the run prints its seed and the command that replays it, and the test
// prints the part of the history that breaks a check.
//
// ONCEKIT_SEED sets the seed (a fresh one otherwise). ONCEKIT_STRESS sets how long a run
// lasts (a Go duration such as 5m); without it a run lasts the short duration its test
// gives, which keeps `go test` quick. `make stress` sets ONCEKIT_STRESS.
package history

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Run is one randomized run: its seed and how long it lasts.
type Run struct {
	Seed     uint64
	Duration time.Duration
	// Stress is true when ONCEKIT_STRESS set the duration.
	Stress bool
}

// Start reads the seed and the duration of a run, and arranges for a failing test to print
// the command that replays it. pkg is the package's directory from the module root, such as
// "./ledger".
func Start(t *testing.T, pkg string, short time.Duration) Run {
	t.Helper()
	r := Run{Seed: rand.Uint64(), Duration: short}
	if s := os.Getenv("ONCEKIT_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("history: ONCEKIT_SEED=%q is not an unsigned integer", s)
		}
		r.Seed = seed
	}
	if s := os.Getenv("ONCEKIT_STRESS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("history: ONCEKIT_STRESS=%q is not a positive duration such as 5m", s)
		}
		r.Duration, r.Stress = d, true
	}
	t.Logf("history: seed %d, running for %s", r.Seed, r.Duration)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("history: replay this run with: ONCEKIT_SEED=%d ONCEKIT_STRESS=%s go test -race -count=1 -run '^%s$' %s",
				r.Seed, r.Duration, t.Name(), pkg)
		}
	})
	return r
}

// Rand returns the random source of client i: the same for the same seed and i.
func (r Run) Rand(i int) *rand.Rand {
	return rand.New(rand.NewPCG(r.Seed, uint64(i)+1))
}

// Event is one entry of a history.
type Event struct {
	// Seq orders events as the log received them.
	Seq int
	// At is the time since the log started.
	At time.Duration
	// Client is the client (goroutine) that recorded the event.
	Client int
	// Kind says what happened: "call", "return", "start" (fn started), "effect", "fault".
	Kind string
	// Op names the operation, such as "Do" or "Claim".
	Op string
	// Key is the key (or event) the entry concerns.
	Key string
	// Detail is free text: arguments, the outcome, the error.
	Detail string
}

func (e Event) String() string {
	return fmt.Sprintf("#%d %9.3fms c%-3d %-6s %-14s %-14s %s", e.Seq, float64(e.At.Microseconds())/1000, e.Client, e.Kind, e.Op, e.Key, e.Detail)
}

// Log records the events of a run. It is safe for concurrent use.
type Log struct {
	mu     sync.Mutex
	start  time.Time
	events []Event
}

// NewLog returns an empty log whose clock starts now.
func NewLog() *Log { return &Log{start: time.Now()} }

// Add records e, setting its Seq and At, and returns its Seq.
func (l *Log) Add(e Event) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq = len(l.events)
	e.At = time.Since(l.start)
	l.events = append(l.events, e)
	return e.Seq
}

// Events returns a copy of the events recorded so far, in order.
func (l *Log) Events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// Len is the number of events recorded so far.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// DumpOnFailure writes the whole log to the file ONCEKIT_HISTORY_DUMP names, when it is
// set and t failed, for a look at more than the part a violation prints.
func (l *Log) DumpOnFailure(t testing.TB) {
	path := os.Getenv("ONCEKIT_HISTORY_DUMP")
	if path == "" || !t.Failed() {
		return
	}
	if err := os.WriteFile(path, []byte(Format(l.Events(), 0)), 0o644); err != nil {
		t.Logf("history: dump: %v", err)
		return
	}
	t.Logf("history: the whole log is in %s", path)
}

// Of returns the events concerning key, in order.
func (l *Log) Of(key string) []Event {
	var out []Event
	for _, e := range l.Events() {
		if e.Key == key {
			out = append(out, e)
		}
	}
	return out
}

// Format renders events one per line, at most limit of them (the last ones when cut).
func Format(events []Event, limit int) string {
	var b strings.Builder
	if limit > 0 && len(events) > limit {
		fmt.Fprintf(&b, "  ... %d earlier events left out\n", len(events)-limit)
		events = events[len(events)-limit:]
	}
	for _, e := range events {
		b.WriteString("  ")
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Violation is a broken check: what broke, and the events that show it.
type Violation struct {
	Check  string
	Key    string
	What   string
	Events []Event
}

// Report fails t with every violation, each with its part of the history (at most limit
// events), and returns how many there were. Violations are reported by check, then key.
func Report(t testing.TB, vs []Violation, limit int) int {
	t.Helper()
	sort.SliceStable(vs, func(i, j int) bool {
		if vs[i].Check != vs[j].Check {
			return vs[i].Check < vs[j].Check
		}
		return vs[i].Key < vs[j].Key
	})
	counts := map[string]int{}
	for _, v := range vs {
		counts[v.Check]++
	}
	checks := make([]string, 0, len(counts))
	for c := range counts {
		checks = append(checks, c)
	}
	sort.Strings(checks)
	for _, c := range checks {
		t.Errorf("history: check %q broken %d times", c, counts[c])
	}
	// The first violation is the one whose last event came first: when the history
	// first showed it.
	first, firstCheck := time.Duration(-1), ""
	for _, v := range vs {
		if len(v.Events) == 0 {
			continue
		}
		if at := v.Events[len(v.Events)-1].At; first < 0 || at < first {
			first, firstCheck = at, v.Check
		}
	}
	if first >= 0 {
		t.Logf("history: first violation at %.1fs, check %q", first.Seconds(), firstCheck)
	}
	shown := map[string]int{}
	for i, v := range vs {
		if shown[v.Check]++; shown[v.Check] > 3 {
			continue
		}
		if i == 1000 {
			t.Errorf("history: %d more violations left out", len(vs)-i)
			break
		}
		t.Errorf("history: check %q broken on key %s: %s\n%s", v.Check, v.Key, v.What, Format(v.Events, limit))
	}
	return len(vs)
}

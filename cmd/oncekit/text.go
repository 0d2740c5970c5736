package main

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Text for a person: times, durations and counts as one writes them, and what a user
// typed cut short in a message.

// bounded cuts what a user typed for an error message.
func bounded(s string) string { return clip(s, 40) }

// clip cuts s to at most n bytes, on a character boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// parseWhen reads a time given as RFC 3339 or as a duration before now.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usageError{fmt.Sprintf("%s %q: give a time such as 2025-01-02T15:04:05Z, or a duration ago such as 90m", flag, bounded(s))}
}

// ago says how long ago t was, or how long until it is, to the second.
func ago(t, now time.Time) string {
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// shortDuration writes d without its zero minutes and seconds: 168h, not 168h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "h") {
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

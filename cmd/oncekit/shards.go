package main

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// shardURL is one shard of the command line.
type shardURL struct{ name, url string }

// shards returns the shards the command runs on: --shard-url's, else ONCEKIT_SHARDS's,
// narrowed to --shard; none when neither names any.
func (a *app) shards() ([]shardURL, error) {
	entries := a.shardURLs
	if len(entries) == 0 {
		for _, e := range strings.Split(a.getenv("ONCEKIT_SHARDS"), ";") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, e)
			}
		}
	}
	if len(entries) == 0 {
		if a.only != "" {
			return nil, usageError{fmt.Sprintf("--shard %s names a shard, but no shard is given: add --shard-url NAME=URL for each, or set ONCEKIT_SHARDS", a.only)}
		}
		return nil, nil
	}
	if a.databaseURL != "" {
		return nil, usageError{"--database-url and shards (--shard-url or ONCEKIT_SHARDS) exclude each other: give one"}
	}
	var shards []shardURL
	seen := map[string]bool{}
	for i, e := range entries {
		name, url, ok := strings.Cut(e, "=")
		if !ok || name == "" || url == "" {
			return nil, usageError{fmt.Sprintf("shard %d of %d is not NAME=URL, such as eu=postgres://oncekit@db-eu/app", i+1, len(entries))}
		}
		if seen[name] {
			return nil, usageError{fmt.Sprintf("shard %q is given twice", name)}
		}
		seen[name] = true
		if a.only == "" || a.only == name {
			shards = append(shards, shardURL{name, url})
		}
	}
	if len(shards) == 0 {
		return nil, usageError{fmt.Sprintf("--shard %s is none of the shards given (%s)", a.only, strings.Join(slices.Sorted(maps.Keys(seen)), ", "))}
	}
	if len(shards) > 1 && a.json {
		return nil, usageError{"--json prints one document: with several shards, name one with --shard"}
	}
	return shards, nil
}

// onShards runs fn on each shard in turn, whatever the others return: each shard's
// errors are printed as they come, and the exit code is the first shard's that failed.
// A record or event that one shard has is found: "not found" elsewhere is no failure
// then, and is said once when no shard has it.
func (a *app) onShards(cmd *cobra.Command, shards []shardURL, fn func() error) error {
	var (
		code     = exitOK
		notFound error
		found    bool
	)
	for _, s := range shards {
		a.databaseURL, a.shard = s.url, s.name
		err := fn()
		opened := a.pool != nil
		if opened {
			a.pool.Close()
			a.pool = nil
		}
		var ee exitError
		switch {
		case err == nil:
			found = true
		case errors.As(err, &ee) && ee.code == exitNotFound:
			notFound = err
		default:
			if c := a.exit(cmd, ranError{shardError{s.name, err}}); code == exitOK {
				code = c
			}
		}
		if !opened {
			break // the command needs no database: once is enough
		}
	}
	a.databaseURL, a.shard = "", ""
	if code != exitOK {
		return silentExit{code}
	}
	if notFound != nil && !found {
		return ranError{notFound}
	}
	return nil
}

// shardError names the shard an error came from.
type shardError struct {
	shard string
	err   error
}

func (e shardError) Error() string { return fmt.Sprintf("shard %s: %v", e.shard, e.err) }
func (e shardError) Unwrap() error { return e.err }

// silentExit ends the command with code, its errors printed already.
type silentExit struct{ code int }

func (e silentExit) Error() string { return fmt.Sprintf("exit %d", e.code) }

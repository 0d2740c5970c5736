// Package config fills in the defaults of the public packages' configurations, and
// holds the defaults they share.
package config

import (
	"os"
	"path/filepath"
	"time"
)

// SchemaDefault is the schema every feature's tables live in unless configured
// otherwise.
const SchemaDefault = "oncekit"

// PurgeBatchDefault is how many rows one purge statement deletes at most.
const PurgeBatchDefault = 500

// PurgePauseDefault is how long a purge waits between two statements.
const PurgePauseDefault = 50 * time.Millisecond

// Of returns *cfg, or the zero value when cfg is nil: a nil *Config means all defaults.
func Of[T any](cfg *T) T {
	if cfg == nil {
		var zero T
		return zero
	}
	return *cfg
}

// Or returns v, or def when v is the zero value: a zero field means its default.
func Or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// CacheDir returns where built and fetched tools (the Temporal CLI, PostgreSQL server
// binaries) are kept: $ONCEKIT_CACHE, else $XDG_CACHE_HOME/oncekit, else
// ~/.cache/oncekit.
func CacheDir() string {
	if d := os.Getenv("ONCEKIT_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "oncekit")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "oncekit")
	}
	return filepath.Join(os.TempDir(), "oncekit-cache")
}

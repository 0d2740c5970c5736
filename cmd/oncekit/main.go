// Command oncekit operates an oncekit schema from a terminal: it applies and reports the
// migrations, shows what the ledger, the outbox and the inbox hold, finds the records an
// on-call engineer is asked about (by tenant, operation, time, key prefix, or the
// workflow, run and activity IDs activity keys are made of), and releases, evicts,
// retries and purges, safely: a change is shown first and made only with --yes, a live
// lease is released only with --force, and each release and eviction keeps an audit row
// that inspect shows.
//
// oncekit --help lists the commands; oncekit COMMAND --help describes one and its flags.
// It reads the database from --database-url or DATABASE_URL, or, when neither is set,
// from the PG* variables and ~/.pgpass as psql does.
//
// The command is a module of its own, so that a program importing oncekit's packages
// does not get its dependencies. Build it from a clone of the repository with make
// oncekit. Releases are recorded in CHANGELOG.md; once one is published as a module
// (tagged cmd/oncekit/vX.Y.Z), go install github.com/oncekit/oncekit/cmd/oncekit@latest
// installs it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

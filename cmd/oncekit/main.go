// Command oncekit operates an oncekit schema: it applies the migrations, shows what the
// ledger and the outbox hold, and releases, evicts or purges records. It reads the
// database from DATABASE_URL and the schema from --schema (default "oncekit").
//
//	oncekit migrate [--print]
//	oncekit status
//	oncekit inspect TENANT OPERATION KEY
//	oncekit list [--state S] [--operation OP] [--tenant T] [--older-than D] [--stuck] [--limit N]
//	oncekit release TENANT OPERATION KEY [--yes]
//	oncekit evict TENANT OPERATION KEY [--yes]
//	oncekit purge [--batch N]
//	oncekit outbox dead [--limit N]
//	oncekit outbox retry ID...
//
// Every command takes --json for output a script can read. Exit codes: 0 done; 1 the
// database refused or could not be reached; 2 a usage error; 3 no such record or event;
// 4 a change refused because --yes was not given (the command says what it would do).
//
// Install it with go install github.com/oncekit/oncekit/cmd/oncekit@latest.
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

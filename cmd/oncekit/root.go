package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// Exit codes.
const (
	exitOK         = 0
	exitFailed     = 1 // the database refused or could not be reached
	exitUsage      = 2 // a mistake in the command line
	exitNotFound   = 3 // no such record, event or message
	exitRefused    = 4 // a change shown and not made: --yes (or --force) was not given
	exitSchema     = 5 // the schema is not oncekit's, lacks a table, or is ahead of this build
	exitWrongState = 6 // the record or event is not in a state the action applies to
	exitPending    = 7 // migrate status: migrations are pending
)

// exitCodeTable says what each exit code means: the root command's help prints it, and
// docs/operating.md's table says the same (TestExitCodesAsDocumented).
var exitCodeTable = []struct {
	code    int
	meaning string
}{
	{exitOK, "done"},
	{exitFailed, "the database refused or could not be reached"},
	{exitUsage, "a usage error: a mistake in the command line"},
	{exitNotFound, "no such record, event or inbox message"},
	{exitRefused, "a change shown and not made: add --yes, or --force for a live lease (an explicit --dry-run exits 0)"},
	{exitSchema, "the schema is not migrated, lacks a table, or is newer than this build"},
	{exitWrongState, "the record or event is not in a state the action applies to: a completed or failed record is evicted, not released; a pending one is released, not evicted; only a dead event is retried"},
	{exitPending, "migrate status found migrations pending: oncekit migrate applies them"},
}

// exitCodes is the exit codes' description, in the root command's help.
func exitCodes() string {
	var b strings.Builder
	b.WriteString("Exit codes:\n")
	for _, e := range exitCodeTable {
		fmt.Fprintf(&b, "  %d  %s\n", e.code, e.meaning)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// app is one invocation of the command.
type app struct {
	ctx         context.Context
	out, errOut io.Writer
	getenv      func(string) string

	databaseURL string
	schema      string
	json        bool
	shardURLs   []string // --shard-url, NAME=URL each
	only        string   // --shard
	shard       string   // the shard the command runs on now, when there are shards
	headings    int      // shard headings printed

	pool *pgxpool.Pool
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitError ends the command with a code other than 1.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// ranError marks an error returned by a command's own code, as opposed to one cobra
// returns for the command line.
type ranError struct{ err error }

func (e ranError) Error() string { return e.err.Error() }
func (e ranError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, out, errOut io.Writer, getenv func(string) string) int {
	a := &app{ctx: ctx, out: out, errOut: errOut, getenv: getenv}
	root := a.rootCommand()
	// --json shapes the errors too, also those of a command line cobra refuses before
	// it sets the flag (defining the flag set it false).
	for _, arg := range args {
		if arg == "--" {
			break
		}
		if arg == "--json" || arg == "--json=true" {
			a.json = true
		}
	}
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	cmd, err := root.ExecuteContextC(ctx)
	if a.pool != nil {
		a.pool.Close()
	}
	return a.exit(cmd, err)
}

// exit prints err, if any, with the command's one prefix, on one line (a JSON object
// under --json), and returns the exit code.
func (a *app) exit(cmd *cobra.Command, err error) int {
	if err == nil {
		return exitOK
	}
	var (
		ran    ranError
		usage  usageError
		ee     exitError
		silent silentExit
		on     shardError
	)
	if errors.As(err, &silent) {
		return silent.code
	}
	help := "oncekit --help"
	if cmd != nil {
		help = cmd.CommandPath() + " --help"
	}
	shard := ""
	if errors.As(err, &on) {
		shard = on.shard
	}
	code, msg := exitFailed, ""
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &ran), errors.As(err, &usage):
		code, msg = exitUsage, oneLine(err.Error())
	case errors.As(err, &ee):
		code, msg = ee.code, oneLine(ee.msg)
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // undefined_table, invalid_schema_name
		code, msg = exitSchema, fmt.Sprintf("schema %q lacks a table this command reads (%s): run `oncekit migrate`, or name the schema oncekit's tables are in with --schema",
			a.schema, oneLine(pgErr.Message))
	default:
		if on.err != nil {
			err = on.err
		}
		msg = oneLine(err.Error())
	}
	if a.json {
		v := jsonError{Error: msg, ExitCode: code, Shard: shard}
		if code == exitUsage {
			v.Help = help
		}
		b, _ := json.Marshal(v)
		fmt.Fprintf(a.errOut, "%s\n", b)
		return code
	}
	prefix := "oncekit: "
	if shard != "" {
		prefix += "shard " + shard + ": "
	}
	if code == exitUsage {
		fmt.Fprintf(a.errOut, "%s%s (%s describes the command and its flags)\n", prefix, msg, help)
		return code
	}
	fmt.Fprintf(a.errOut, "%s%s\n", prefix, msg)
	return code
}

// jsonError is an error as --json prints it on stderr.
type jsonError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
	Shard    string `json:"shard,omitempty"`
	// Help is the command that describes the command line, for a usage error.
	Help string `json:"help,omitempty"`
}

// oneLine keeps an error on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "oncekit",
		Short: "Operate an oncekit schema: migrations, records, outbox and inbox",
		Long: `oncekit operates the tables of an oncekit schema: it applies and reports the
migrations, finds and shows ledger records, and releases, evicts, retries and purges.

Changes are safe by default: release, evict, purge, outbox retry --all/--topic and the
purges show what they would change and change nothing without --yes (-y); a pending
record whose lease is live is released only with --force; each release and eviction
needs --reason and keeps an audit row that inspect shows.

The database is --database-url, or DATABASE_URL, or, when neither is set, what the PG*
variables (PGHOST, PGUSER, PGDATABASE, ...) and ~/.pgpass say, as for psql. With shards
(--shard-url NAME=URL, repeated, or ONCEKIT_SHARDS), each command runs on every shard in
turn under a "== shard NAME ==" heading, or on --shard NAME alone.

With --json, output is JSON for scripts, and so is an error on stderr:
{"error": "...", "exit_code": N} (with "shard" when it came from one).

` + exitCodes(),
		Example: `  oncekit status
  oncekit list --stuck
  oncekit inspect shop payments.charge 'v1:run:0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44:5'
  oncekit audit --since 24h`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Version:           commandVersion(),
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
	}
	root.SetVersionTemplate("oncekit {{.Version}}\n")
	// cobra's completion commands, made now rather than at Execute, to give them examples.
	root.InitDefaultCompletionCmd()
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "the database, such as postgres://user@host:5432/db (default: DATABASE_URL, else the PG* variables and ~/.pgpass)")
	pf.StringVar(&a.schema, "schema", ledger.SchemaDefault, "the schema holding oncekit's tables")
	pf.BoolVar(&a.json, "json", false, "print JSON (snake_case keys, [] for empty lists) for scripts")
	pf.StringArrayVar(&a.shardURLs, "shard-url", nil, "a shard, as NAME=URL; repeat it for each shard, and each command runs on every shard in turn (default: ONCEKIT_SHARDS, NAME=URL entries separated by semicolons)")
	pf.StringVar(&a.only, "shard", "", "run on this shard alone, one of those --shard-url or ONCEKIT_SHARDS name")
	defer completionExamples(root)
	root.AddCommand(a.migrateCommand(), a.statusCommand(), a.inspectCommand(), a.listCommand(),
		a.changeCommand(ledger.ActionRelease), a.changeCommand(ledger.ActionEvict), a.purgeCommand(),
		a.outboxCommand(), a.inboxCommand(), a.auditCommand(), a.uiCommand(), a.versionCommand())
	return root
}

// runE adapts a command's function: its errors are marked as its own. With shards
// (--shard-url or ONCEKIT_SHARDS) it runs once per shard, or on --shard alone.
func (a *app) runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		shards, err := a.shards()
		if err != nil {
			return err
		}
		if len(shards) == 0 {
			if err := fn(cmd, args); err != nil {
				return ranError{err}
			}
			return nil
		}
		return a.onShards(cmd, shards, func() error { return fn(cmd, args) })
	}
}

// args checks the number of positional arguments, naming them in the error.
func args(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if n >= 0 && len(args) != n {
			if n == 0 {
				return usageError{fmt.Sprintf("%s takes no arguments, only flags (got %d)", cmd.CommandPath(), len(args))}
			}
			return usageError{fmt.Sprintf("%s takes %s (got %d arguments)", cmd.CommandPath(), names, len(args))}
		}
		return nil
	}
}

// connect opens the database and checks its schema against this build: a schema newer
// than the build, or one without oncekit's tables, is refused; missing migrations are
// reported.
func (a *app) connect() error {
	if err := a.open(); err != nil {
		return err
	}
	status, err := migrate.Status(a.ctx, a.pool, a.schema)
	if err != nil {
		return err
	}
	if err := migrate.Check(a.schema, status); err != nil {
		return exitError{exitSchema, fmt.Sprintf("%s; this is oncekit %s", strings.TrimPrefix(err.Error(), "oncekit/migrate: "), commandVersion())}
	}
	applied, pending := 0, []string{}
	for _, st := range status {
		applied += len(st.Applied)
		for _, m := range st.Pending {
			pending = append(pending, fmt.Sprintf("%s/%03d_%s", m.Line, m.Version, m.Name))
		}
	}
	if applied == 0 {
		return exitError{exitSchema, fmt.Sprintf("schema %q has no oncekit tables: run `oncekit migrate` to create them, or name the schema they are in with --schema", a.schema)}
	}
	if len(pending) > 0 {
		fmt.Fprintf(a.errOut, "oncekit: warning: schema %q lacks %d migrations (%s): run `oncekit migrate`\n", a.schema, len(pending), strings.Join(pending, ", "))
	}
	return nil
}

// open opens the database without looking at the schema.
func (a *app) open() error {
	url := a.databaseURL
	if url == "" {
		url = a.getenv("DATABASE_URL")
	}
	// An empty URL leaves pgx to the PG* variables and ~/.pgpass, as libpq does.
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return usageError{fmt.Sprintf("the database URL does not parse: %v", oneLine(err.Error()))}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(a.ctx, cfg)
	if err != nil {
		return err
	}
	if a.shard != "" && !a.json {
		if a.headings > 0 {
			fmt.Fprintln(a.out)
		}
		a.headings++
		fmt.Fprintf(a.out, "== shard %s ==\n", a.shard)
	}
	if err := pool.Ping(a.ctx); err != nil {
		pool.Close()
		if a.shard != "" {
			return fmt.Errorf("cannot reach shard %q (is it running, and is its --shard-url or ONCEKIT_SHARDS entry right?): %w", a.shard, err)
		}
		return fmt.Errorf("cannot reach the database (is it running, and are --database-url or DATABASE_URL, or the PG* variables, right?): %w", err)
	}
	a.pool = pool
	return nil
}

// emit prints v as JSON, or calls text to print it as aligned text.
func (a *app) emit(v any, text func(w *tabwriter.Writer)) error {
	if a.json {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	text(w)
	return w.Flush()
}

// actor names who runs the command, for audit rows: the OS user and host.
func actor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		name += "@" + host
	}
	return name
}

// completionExamples gives cobra's completion commands their examples.
func completionExamples(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Example = "  oncekit completion bash > /etc/bash_completion.d/oncekit\n  oncekit completion zsh > \"${fpath[1]}/_oncekit\""
		for _, shell := range c.Commands() {
			switch shell.Name() {
			case "bash":
				shell.Example = "  oncekit completion bash > /etc/bash_completion.d/oncekit"
			case "zsh":
				shell.Example = "  oncekit completion zsh > \"${fpath[1]}/_oncekit\""
			case "fish":
				shell.Example = "  oncekit completion fish > ~/.config/fish/completions/oncekit.fish"
			case "powershell":
				shell.Example = "  oncekit completion powershell | Out-String | Invoke-Expression"
			}
		}
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
)

const usage = `usage: oncekit COMMAND [flags] [args]

commands:
  migrate [--print]                        apply every migration line (--print: the SQL)
  status                                   schema version, records by state, outbox backlog
  inspect TENANT OPERATION KEY             one record
  list [--state S] [--operation OP] [--tenant T] [--older-than D] [--stuck] [--limit N]
  release TENANT OPERATION KEY [--yes]     delete a pending record stuck in progress
  evict TENANT OPERATION KEY [--yes]       delete a completed or failed record
  purge [--batch N]                        delete expired records, in batches
  outbox dead [--limit N]                  list dead events
  outbox retry ID...                       make dead events pending again

every command: --schema NAME (default oncekit), --json
the database: DATABASE_URL
exit codes: 0 done, 1 database error, 2 usage, 3 not found, 4 refused without --yes
`

// cli is one invocation.
type cli struct {
	ctx    context.Context
	out    io.Writer
	errOut io.Writer
	getenv func(string) string
	schema string
	json   bool
	pool   *pgxpool.Pool
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

func run(ctx context.Context, args []string, out, errOut io.Writer, getenv func(string) string) int {
	c := &cli{ctx: ctx, out: out, errOut: errOut, getenv: getenv}
	err := c.dispatch(args)
	if c.pool != nil {
		c.pool.Close()
	}
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(errOut, "oncekit: %s\n\n%s", ue.msg, usage)
		return exitUsage
	case errors.As(err, &ee):
		fmt.Fprintf(errOut, "oncekit: %s\n", ee.msg)
		return ee.code
	default:
		fmt.Fprintf(errOut, "oncekit: %v\n", err)
		return exitFailed
	}
}

func (c *cli) dispatch(args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) == 0 {
			return usageError{"no command"}
		}
		_, err := io.WriteString(c.out, usage)
		return err
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "migrate":
		return c.migrate(rest)
	case "status":
		return c.status(rest)
	case "inspect":
		return c.inspect(rest)
	case "list":
		return c.list(rest)
	case "release":
		return c.change(rest, "release")
	case "evict":
		return c.change(rest, "evict")
	case "purge":
		return c.purge(rest)
	case "outbox":
		if len(rest) == 0 {
			return usageError{"outbox needs a subcommand: dead or retry"}
		}
		switch rest[0] {
		case "dead":
			return c.outboxDead(rest[1:])
		case "retry":
			return c.outboxRetry(rest[1:])
		}
		return usageError{fmt.Sprintf("unknown outbox subcommand %q: dead or retry", rest[0])}
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// flags returns a flag set with the flags every command takes.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.schema, "schema", ledger.SchemaDefault, "the schema holding oncekit's tables")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	return fs
}

// parse parses flags placed anywhere among the positional arguments, and checks their
// number.
func parse(fs *flag.FlagSet, args []string, positional int, names string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{fmt.Sprintf("%s: %v", fs.Name(), err)}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if positional >= 0 && len(pos) != positional {
		return nil, usageError{fmt.Sprintf("%s takes %s", fs.Name(), names)}
	}
	return pos, nil
}

// connect opens the database named by DATABASE_URL.
func (c *cli) connect() error {
	url := c.getenv("DATABASE_URL")
	if url == "" {
		return usageError{"DATABASE_URL is not set: set it to the database, such as postgres://user:pass@host:5432/db"}
	}
	pool, err := pgxpool.New(c.ctx, url)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	if err := pool.Ping(c.ctx); err != nil {
		pool.Close()
		return fmt.Errorf("cannot reach the database at DATABASE_URL (is it running, and are host, user and password right?): %w", err)
	}
	c.pool = pool
	return nil
}

func (c *cli) ledger() (*ledger.Ledger, error) {
	if err := c.connect(); err != nil {
		return nil, err
	}
	return ledger.New(c.pool, &ledger.Config{Schema: c.schema})
}

// emit prints v as JSON, or calls text to print it as aligned text.
func (c *cli) emit(v any, text func(w *tabwriter.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	text(w)
	return w.Flush()
}

func (c *cli) migrate(args []string) error {
	fs := c.flags("migrate")
	print := fs.Bool("print", false, "print the SQL instead of applying it")
	if _, err := parse(fs, args, 0, "no arguments"); err != nil {
		return err
	}
	if *print {
		script, err := migrate.Script(c.schema)
		if err != nil {
			return err
		}
		_, err = io.WriteString(c.out, script)
		return err
	}
	if err := c.connect(); err != nil {
		return err
	}
	res, err := migrate.Up(c.ctx, c.pool, c.schema)
	if err != nil {
		return err
	}
	return c.emit(res, func(w *tabwriter.Writer) {
		if len(res.Applied) == 0 {
			fmt.Fprintf(w, "schema %s is current\n", c.schema)
		}
		for _, a := range res.Applied {
			fmt.Fprintf(w, "applied\t%s/%03d_%s\n", a.Line, a.Version, a.Name)
		}
	})
}

// statusReport is what status prints.
type statusReport struct {
	Schema     string                            `json:"schema"`
	Migrations map[string]int                    `json:"migrations"`
	Records    map[ledger.State]map[string]int64 `json:"records"`
	Oldest     *time.Time                        `json:"oldest_pending,omitempty"`
	Stuck      int64                             `json:"stuck"`
	Expired    int64                             `json:"expired"`
	Outbox     outbox.Stats                      `json:"outbox"`
	_          struct{}                          `json:"-"`
}

func (c *cli) status(args []string) error {
	fs := c.flags("status")
	if _, err := parse(fs, args, 0, "no arguments"); err != nil {
		return err
	}
	l, err := c.ledger()
	if err != nil {
		return err
	}
	rep := statusReport{Schema: c.schema}
	if rep.Migrations, err = migrate.Versions(c.ctx, c.pool, c.schema); err != nil {
		return fmt.Errorf("read the schema's migrations (run oncekit migrate first?): %w", err)
	}
	st, err := l.Stats(c.ctx)
	if err != nil {
		return err
	}
	rep.Records, rep.Stuck, rep.Expired = st.ByState, st.Stuck, st.Expired
	if !st.OldestPending.IsZero() {
		rep.Oldest = &st.OldestPending
	}
	out, err := outbox.New(c.pool, &outbox.Config{Schema: c.schema})
	if err != nil {
		return err
	}
	if rep.Outbox, err = out.Stats(c.ctx); err != nil {
		return err
	}
	return c.emit(rep, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "schema\t%s\n", rep.Schema)
		var lines []string
		for _, line := range []string{"ledger", "webhook", "inbox", "outbox"} {
			lines = append(lines, fmt.Sprintf("%s %d", line, rep.Migrations[line]))
		}
		fmt.Fprintf(w, "migrations\t%s\n", strings.Join(lines, ", "))
		fmt.Fprintln(w, "\nstate\toperation\trecords")
		for _, state := range []ledger.State{ledger.StatePending, ledger.StateCompleted, ledger.StateFailed} {
			for op, n := range sorted(rep.Records[state]) {
				fmt.Fprintf(w, "%s\t%s\t%d\n", state, op, n)
			}
		}
		fmt.Fprintln(w)
		oldest := "-"
		if rep.Oldest != nil {
			oldest = rep.Oldest.UTC().Format(time.RFC3339) + " (" + time.Since(*rep.Oldest).Round(time.Second).String() + " ago)"
		}
		fmt.Fprintf(w, "oldest pending\t%s\n", oldest)
		fmt.Fprintf(w, "stuck (lease ran out)\t%d\n", rep.Stuck)
		fmt.Fprintf(w, "expired, awaiting purge\t%d\n", rep.Expired)
		fmt.Fprintf(w, "outbox\t%d pending, %d published, %d dead\n", rep.Outbox.Pending, rep.Outbox.Published, rep.Outbox.Dead)
	})
}

// recordView is a record as the command shows it.
type recordView struct {
	Tenant      string     `json:"tenant"`
	Operation   string     `json:"operation"`
	Key         string     `json:"key"`
	State       string     `json:"state"`
	Fingerprint string     `json:"fingerprint"`
	Status      int        `json:"status,omitempty"`
	Body        string     `json:"body_preview,omitempty"`
	BodyBytes   int        `json:"body_bytes"`
	ResourceRef string     `json:"resource_ref,omitempty"`
	ErrorCode   string     `json:"error_code,omitempty"`
	Error       string     `json:"error_message,omitempty"`
	Owner       string     `json:"owner_token,omitempty"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	Uncertain   bool       `json:"uncertain"`
	Attempts    int        `json:"attempts"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	ExpiresAt   time.Time  `json:"expires_at"`
	Expired     bool       `json:"expired"`
	Stuck       bool       `json:"stuck"`
}

// previewBytes bounds the body shown by inspect and list.
const previewBytes = 200

func view(r ledger.Record) recordView {
	v := recordView{Tenant: r.Scope.Tenant, Operation: r.Scope.Operation, Key: string(r.Key), State: string(r.State),
		Fingerprint: string(r.Fingerprint), Status: r.Response.Code, BodyBytes: len(r.Response.Body),
		ResourceRef: r.Response.ResourceRef, ErrorCode: r.ErrorCode, Error: r.ErrorMessage, Uncertain: r.Uncertain,
		Attempts: r.Attempts, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt, Expired: r.Expired,
		Stuck: r.State == ledger.StatePending && r.LeaseExpired}
	body := r.Response.Body
	if len(body) > previewBytes {
		body = body[:previewBytes]
	}
	v.Body = strings.ToValidUTF8(string(body), "?")
	if r.State == ledger.StatePending {
		v.Owner = r.OwnerToken.String()
		lu := r.LeaseUntil
		v.LeaseUntil = &lu
	}
	return v
}

// record parses TENANT OPERATION KEY and reads that record.
func (c *cli) record(fs *flag.FlagSet, args []string) (*ledger.Ledger, *ledger.Record, error) {
	pos, err := parse(fs, args, 3, "TENANT OPERATION KEY")
	if err != nil {
		return nil, nil, err
	}
	scope, key := keys.Scope{Tenant: pos[0], Operation: pos[1]}, keys.Key(pos[2])
	l, err := c.ledger()
	if err != nil {
		return nil, nil, err
	}
	r, err := l.Get(c.ctx, scope, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil, nil, exitError{exitNotFound, fmt.Sprintf("no record of key %q in %s (check the tenant and operation; oncekit list --tenant %s shows what there is)", key, scope, scope.Tenant)}
	}
	return l, r, err
}

func (c *cli) inspect(args []string) error {
	_, r, err := c.record(c.flags("inspect"), args)
	if err != nil {
		return err
	}
	v := view(*r)
	return c.emit(v, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "tenant\t%s\noperation\t%s\nkey\t%s\nstate\t%s\n", v.Tenant, v.Operation, v.Key, v.State)
		if v.Stuck {
			fmt.Fprintf(w, "stuck\tits lease ran out and no attempt took it over\n")
		}
		fmt.Fprintf(w, "fingerprint\t%s\n", v.Fingerprint)
		switch v.State {
		case string(ledger.StateFailed):
			fmt.Fprintf(w, "error\t%s: %s\n", v.ErrorCode, v.Error)
		case string(ledger.StateCompleted):
			fmt.Fprintf(w, "status\t%d\nbody\t%d bytes: %s\n", v.Status, v.BodyBytes, v.Body)
		}
		if v.ResourceRef != "" {
			fmt.Fprintf(w, "resource\t%s\n", v.ResourceRef)
		}
		if v.LeaseUntil != nil {
			fmt.Fprintf(w, "owner\t%s\nlease until\t%s\n", v.Owner, v.LeaseUntil.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(w, "uncertain\t%v\nattempts\t%d\n", v.Uncertain, v.Attempts)
		fmt.Fprintf(w, "created\t%s\nupdated\t%s\nexpires\t%s\n", v.CreatedAt.UTC().Format(time.RFC3339),
			v.UpdatedAt.UTC().Format(time.RFC3339), v.ExpiresAt.UTC().Format(time.RFC3339))
	})
}

func (c *cli) list(args []string) error {
	fs := c.flags("list")
	var o ledger.ListOpts
	state := fs.String("state", "", "pending, completed or failed")
	fs.StringVar(&o.Operation, "operation", "", "only this operation")
	fs.StringVar(&o.Tenant, "tenant", "", "only this tenant")
	fs.DurationVar(&o.OlderThan, "older-than", 0, "only records created at least this long ago, such as 1h")
	fs.BoolVar(&o.Stuck, "stuck", false, "only pending records whose lease ran out")
	fs.IntVar(&o.Limit, "limit", 100, "at most this many records")
	if _, err := parse(fs, args, 0, "no arguments, only flags"); err != nil {
		return err
	}
	switch ledger.State(*state) {
	case "", ledger.StatePending, ledger.StateCompleted, ledger.StateFailed:
		o.State = ledger.State(*state)
	default:
		return usageError{fmt.Sprintf("list: --state %q: use pending, completed or failed", *state)}
	}
	l, err := c.ledger()
	if err != nil {
		return err
	}
	recs, err := l.List(c.ctx, &o)
	if err != nil {
		return err
	}
	views := make([]recordView, 0, len(recs))
	for _, r := range recs {
		views = append(views, view(r))
	}
	return c.emit(views, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "tenant\toperation\tkey\tstate\tattempts\tcreated")
		for _, v := range views {
			state := v.State
			if v.Stuck {
				state += " (stuck)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", v.Tenant, v.Operation, v.Key, state, v.Attempts, v.CreatedAt.UTC().Format(time.RFC3339))
		}
	})
}

// change releases or evicts one record; without --yes it says what it would do.
func (c *cli) change(args []string, what string) error {
	fs := c.flags(what)
	yes := fs.Bool("yes", false, "do it")
	l, r, err := c.record(fs, args)
	if err != nil {
		return err
	}
	scope, key := r.Scope, r.Key
	wantPending := what == "release"
	if (r.State == ledger.StatePending) != wantPending {
		hint := "evict it instead"
		if !wantPending {
			hint = "a pending record is released, not evicted"
		}
		return exitError{exitNotFound, fmt.Sprintf("the record of key %q in %s is %s: %s", key, scope, r.State, hint)}
	}
	plan := fmt.Sprintf("%s the %s record of key %q in %s (created %s, attempts %d)", what, r.State, key, scope,
		r.CreatedAt.UTC().Format(time.RFC3339), r.Attempts)
	if wantPending {
		plan += "; the next attempt starts afresh, and an external call is made again"
	} else {
		plan += "; the next request with the key runs again instead of replaying"
	}
	if !*yes {
		return exitError{exitRefused, "would " + plan + ". Run again with --yes to do it."}
	}
	var done bool
	if wantPending {
		done, err = l.ForceRelease(c.ctx, scope, key)
	} else {
		done, err = l.Evict(c.ctx, scope, key)
	}
	if err != nil {
		return err
	}
	if !done {
		return exitError{exitNotFound, fmt.Sprintf("the record of key %q in %s changed meanwhile; nothing was done", key, scope)}
	}
	return c.emit(map[string]any{"done": what, "tenant": scope.Tenant, "operation": scope.Operation, "key": string(key)},
		func(w *tabwriter.Writer) { fmt.Fprintf(w, "done: %s\n", plan) })
}

func (c *cli) purge(args []string) error {
	fs := c.flags("purge")
	batch := fs.Int("batch", ledger.PurgeBatchDefault, "records per statement")
	if _, err := parse(fs, args, 0, "no arguments"); err != nil {
		return err
	}
	if *batch <= 0 {
		return usageError{"purge: --batch must be positive"}
	}
	l, err := c.ledger()
	if err != nil {
		return err
	}
	var total int64
	batches := 0
	for {
		res, err := l.Purge(c.ctx, &ledger.PurgeOpts{BatchSize: *batch, MaxBatches: 1})
		if err != nil {
			return err
		}
		total += res.Deleted
		batches++
		if !c.json {
			fmt.Fprintf(c.errOut, "purge: batch %d deleted %d (%d in all)\n", batches, res.Deleted, total)
		}
		if res.Deleted < int64(*batch) {
			break
		}
	}
	return c.emit(map[string]int64{"deleted": total, "batches": int64(batches)}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "purged %d expired records in %d batches\n", total, batches)
	})
}

func (c *cli) outbox() (*outbox.Outbox, error) {
	if err := c.connect(); err != nil {
		return nil, err
	}
	return outbox.New(c.pool, &outbox.Config{Schema: c.schema})
}

type deadView struct {
	ID        string    `json:"id"`
	Topic     string    `json:"topic"`
	Key       string    `json:"ordering_key,omitempty"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	LastError string    `json:"last_error"`
}

func (c *cli) outboxDead(args []string) error {
	fs := c.flags("outbox dead")
	limit := fs.Int("limit", 100, "at most this many events")
	if _, err := parse(fs, args, 0, "no arguments"); err != nil {
		return err
	}
	if *limit <= 0 {
		return usageError{"outbox dead: --limit must be positive"}
	}
	out, err := c.outbox()
	if err != nil {
		return err
	}
	dead, err := out.Dead(c.ctx, *limit)
	if err != nil {
		return err
	}
	views := make([]deadView, 0, len(dead))
	for _, d := range dead {
		views = append(views, deadView{ID: d.ID.String(), Topic: d.Topic, Key: d.OrderingKey, Attempts: d.Attempts,
			CreatedAt: d.CreatedAt, LastError: d.LastError})
	}
	return c.emit(views, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "id\ttopic\tattempts\tlast error")
		for _, v := range views {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", v.ID, v.Topic, v.Attempts, v.LastError)
		}
	})
}

func (c *cli) outboxRetry(args []string) error {
	fs := c.flags("outbox retry")
	pos, err := parse(fs, args, -1, "")
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError{"outbox retry takes the IDs of dead events (oncekit outbox dead lists them)"}
	}
	ids := make([]uuid.UUID, len(pos))
	for i, p := range pos {
		if ids[i], err = uuid.Parse(p); err != nil {
			return usageError{fmt.Sprintf("outbox retry: %q is not an event ID", p)}
		}
	}
	out, err := c.outbox()
	if err != nil {
		return err
	}
	var missing []string
	for _, id := range ids {
		ok, err := out.Retry(c.ctx, id)
		if err != nil {
			return err
		}
		if ok {
			if !c.json {
				fmt.Fprintf(c.out, "retrying %s\n", id)
			}
		} else {
			missing = append(missing, id.String())
		}
	}
	if len(missing) > 0 {
		return exitError{exitNotFound, "no dead event with ID " + strings.Join(missing, ", ")}
	}
	if c.json {
		return c.emit(map[string]int{"retried": len(ids)}, nil)
	}
	return nil
}

// sorted iterates a map by key.
func sorted(m map[string]int64) func(func(string, int64) bool) {
	return func(yield func(string, int64) bool) {
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		for _, k := range ks {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}

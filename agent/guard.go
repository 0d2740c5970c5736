package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/internal/faultpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Defaults of [Config], the ledger operations the package writes under, and its
// migration line.
const (
	// MigrationLine names the agent's line in the oncekit_migrations table.
	MigrationLine = "agent"
	// TaskLeaseDefault is how long a claimed task is owned without a heartbeat.
	TaskLeaseDefault = time.Minute
	// ApprovalTimeoutDefault is how long a frozen call waits for a decision before it
	// counts as rejected.
	ApprovalTimeoutDefault = 24 * time.Hour
	// OperationTool is the ledger operation of tool calls: set its retention in the
	// ledger's configuration, by operation, for a replay horizon of its own.
	OperationTool = "agent.tool"
	// OperationTask is the ledger operation of task claims.
	OperationTask = "agent.task"
	// DownstreamPurpose is the purpose (see keys.DeriveIn) of the downstream key a tool
	// call sends to its provider.
	DownstreamPurpose = "agent-tool"
)

// TestConfig holds the knobs of [Config] that exist for tests.
type TestConfig struct {
	// NowFunc, when set, replaces the database clock for approval deadlines and the
	// retention of frozen calls. Give the ledger the same one.
	NowFunc func() time.Time
}

// Config configures a [Guard]. A nil *Config means all defaults.
type Config struct {
	// TaskLease is how long a task claimed with [Guard.ClaimTask] stays its agent's
	// without a heartbeat; every guarded tool call renews it. Defaults to
	// [TaskLeaseDefault].
	TaskLease time.Duration
	// CallLease is how long an external tool call owns its key: set it longer than the
	// tool can take. Defaults to the ledger's lease.
	CallLease time.Duration
	// ApprovalTimeout is how long a call frozen for approval waits for a decision; a
	// call nobody decided by then counts as rejected. Defaults to
	// [ApprovalTimeoutDefault].
	ApprovalTimeout time.Duration
	// Retention is how long a call's arguments and approval are kept: keep it equal to
	// the ledger's retention of [OperationTool]. Defaults to ledger.RetentionDefault.
	Retention time.Duration
	// TrustHints lets a tool whose [Hints] say it only reads run without the ledger. A
	// hint is never trusted for a tool that says it is destructive. Defaults to false:
	// every call is guarded.
	TrustHints bool
	// Logger receives a warning per call reported uncertain. Defaults to discarding it.
	Logger *slog.Logger
	// Test holds knobs for tests only; production code leaves it zero.
	Test TestConfig
}

// Guard runs an agent's tool calls once per place in a task, on a [ledger.Ledger]. It
// is safe for concurrent use.
type Guard struct {
	l         *ledger.Ledger
	pool      *pgxpool.Pool
	cfg       Config
	q         queries
	log       *slog.Logger
	lost      lostClaims
	lostTasks lostTasks
}

// errNilFunc is the error of a call given no tool function.
var errNilFunc = errors.New("oncekit/agent: nil function: pass the tool's function")

// New returns a guard on l, whose schema must hold the agent's migration line (see
// [Migrations]; migrate.Up applies it). The ledger must run on one database.
func New(l *ledger.Ledger, cfg *Config) (*Guard, error) {
	if l == nil {
		return nil, errors.New("oncekit/agent: New needs a ledger")
	}
	shards := l.Router().Shards()
	if len(shards) != 1 {
		return nil, errors.New("oncekit/agent: the ledger runs on several shards, which the agent guard does not support yet")
	}
	c := config.Of(cfg)
	c.TaskLease = config.Or(c.TaskLease, TaskLeaseDefault)
	c.ApprovalTimeout = config.Or(c.ApprovalTimeout, ApprovalTimeoutDefault)
	c.Retention = config.Or(c.Retention, ledger.RetentionDefault)
	if c.TaskLease < 0 || c.CallLease < 0 || c.ApprovalTimeout < 0 || c.Retention < 0 {
		return nil, errors.New("oncekit/agent: Config durations must not be negative")
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{l: l, pool: shards[0].Pool, cfg: c, q: newQueries(l.Schema()), log: log}, nil
}

// Ledger returns the ledger the guard runs on.
func (g *Guard) Ledger() *ledger.Ledger { return g.l }

// Hints are what a tool says of itself, as MCP's tool annotations do.
type Hints struct {
	// ReadOnly: the tool changes nothing (MCP's readOnlyHint).
	ReadOnly bool
	// Idempotent: calling it again with the same arguments changes nothing more (MCP's
	// idempotentHint). The guard does not rely on it: a retried model may choose other
	// arguments.
	Idempotent bool
	// Destructive: the tool may destroy or change what exists (MCP's destructiveHint).
	// A destructive tool is always guarded, whatever its other hints say.
	Destructive bool
}

// Tool describes a tool the agent calls.
type Tool struct {
	// Name is the tool's name, as the model knows it.
	Name string
	// AcceptsKey says that the tool's provider deduplicates calls by a key, such as an
	// HTTP Idempotency-Key header: send [Invocation].DownstreamKey. A call whose answer
	// was lost is then made again with the same key. Without it, such a call is
	// reported uncertain and not repeated.
	AcceptsKey bool
	// NeedsApproval freezes every call for a person's decision before it runs (see
	// [Guard.Approve]).
	NeedsApproval bool
	// Hints are the tool's own hints; see [Config].TrustHints.
	Hints Hints
}

// Invocation is what a tool function receives: the call and its keys.
type Invocation struct {
	Call CallRef
	// Args are the call's arguments in canonical JSON.
	Args json.RawMessage
	// DownstreamKey is derived from the call's key (see keys.DeriveIn): send it to a
	// provider that deduplicates by key. It is the same on every attempt of the call.
	DownstreamKey keys.Key
	// Attempt counts the attempts that claimed the call, this one included.
	Attempt int
	// Redrive is true when an earlier attempt claimed the call and did not record an
	// outcome: the provider may have acted, and deduplicates by DownstreamKey.
	Redrive bool
}

// ToolFunc makes a tool call outside the database and returns the output to store and
// hand back to the model. Return ledger.Definitive for a failure the provider answered
// definitively: it is stored and replayed. Return ledger.NotApplied when the provider
// certainly did not act. Any other error means the call may have happened.
type ToolFunc func(ctx context.Context, inv Invocation) (json.RawMessage, error)

// LocalFunc is a tool that writes only to the database, through tx: its writes commit
// with the call's record, so a crash leaves neither.
type LocalFunc func(ctx context.Context, tx pgx.Tx, inv Invocation) (json.RawMessage, error)

// CallOpts are per-call options of [Task.Call] and [Task.CallTx]. A nil *CallOpts means
// all defaults.
type CallOpts struct {
	// Wait bounds how long the call waits for a duplicate of itself in flight, then
	// replays its result. Defaults to 0: fail fast with ledger.ErrInProgress.
	Wait time.Duration
}

// Result is the outcome of a tool call.
type Result struct {
	Call CallRef
	// Output is the tool's output: stored on the first run, and the same on every replay.
	Output json.RawMessage
	// Replayed is true when the output was read from the ledger and the tool did not run.
	Replayed bool
	// Unguarded is true when the tool ran without the ledger, as its hints allowed.
	Unguarded bool
}

// Ref returns the reference of the call of tool at step of task in tenant: its key.
func (g *Guard) Ref(tenant, task, step, tool string) (CallRef, error) {
	for _, f := range []struct{ name, v string }{{"tenant", tenant}, {"task", task}, {"step", step}, {"tool", tool}} {
		if f.v == "" {
			return CallRef{}, fmt.Errorf("oncekit/agent: the call's %s is empty", f.name)
		}
		if err := storable(f.name, f.v); err != nil {
			return CallRef{}, err
		}
	}
	key, err := keys.Business("agent", task, step, tool)
	if err != nil {
		return CallRef{}, err
	}
	return CallRef{Tenant: tenant, Task: task, Step: step, Tool: tool, Key: key}, nil
}

// storable refuses a name PostgreSQL's text cannot hold (a NUL byte, invalid UTF-8)
// with a *keys.ValidationError, before anything is sent or stored.
func storable(field, v string) error {
	if i := strings.IndexByte(v, 0); i >= 0 {
		return &keys.ValidationError{Field: field, Value: truncate(v), Len: len(v), Offset: i, Byte: 0, Err: keys.ErrInvalidByte}
	}
	if !utf8.ValidString(v) {
		for i := 0; i < len(v); {
			r, size := utf8.DecodeRuneInString(v[i:])
			if r == utf8.RuneError && size <= 1 {
				return &keys.ValidationError{Field: field, Value: truncate(v), Len: len(v), Offset: i, Byte: v[i], Err: keys.ErrInvalidByte}
			}
			i += size
		}
	}
	return nil
}

// truncate keeps at most 64 bytes of v for an error, as keys' errors do.
func truncate(v string) string {
	if len(v) > 64 {
		return v[:64]
	}
	return v
}

// querier is what the package's statements run on: a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// call is one prepared tool call.
type call struct {
	ref  CallRef
	tool Tool
	args json.RawMessage
	in   ledger.Intent
	inv  Invocation
}

// prepare checks a call (nilFunc says the caller passed no function) and makes its
// reference, intent and invocation.
func (g *Guard) prepare(t *Task, step string, tool Tool, args json.RawMessage) (*call, error) {
	ref, err := g.Ref(t.Tenant, t.ID, step, tool.Name)
	if err != nil {
		return nil, err
	}
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	canon, err := keys.CanonicalJSON(args)
	if err != nil {
		return nil, fmt.Errorf("oncekit/agent: the arguments of %s: %w", ref, err)
	}
	scope := keys.Scope{Tenant: ref.Tenant, Operation: OperationTool}
	down, err := keys.DeriveIn(scope, ref.Key, DownstreamPurpose)
	if err != nil {
		return nil, err
	}
	c := &call{ref: ref, tool: tool, args: canon,
		in: ledger.Intent{Scope: scope, Key: ref.Key, Fingerprint: keys.FingerprintBytes(canon)}}
	c.inv = Invocation{Call: ref, Args: canon, DownstreamKey: down}
	return c, nil
}

// open prepares a call of t at step and, when the tool needs approval, lets it through
// the gate. It returns a nil call when noFunc is set or the call is malformed, and the
// call with the gate's error when the gate refuses it.
func (g *Guard) open(ctx context.Context, t *Task, step string, tool Tool, args json.RawMessage, noFunc bool) (*call, error) {
	if noFunc {
		return nil, errNilFunc
	}
	c, err := g.prepare(t, step, tool, args)
	if err != nil {
		return nil, err
	}
	if tool.NeedsApproval {
		if err := g.gate(ctx, t, c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// result is the result of a call that did not run: empty, or naming the call.
func (c *call) result() Result {
	if c == nil {
		return Result{}
	}
	return Result{Call: c.ref}
}

func (g *Guard) unguarded(tool Tool) bool {
	// A call that needs a person's approval is frozen for it whatever the tool says.
	return g.cfg.TrustHints && tool.Hints.ReadOnly && !tool.Hints.Destructive && !tool.NeedsApproval
}

func (g *Guard) now() *time.Time {
	if g.cfg.Test.NowFunc == nil {
		return nil
	}
	t := g.cfg.Test.NowFunc()
	return &t
}

// freeze records the call's arguments, in the caller's transaction: for a call that
// needs approval, waiting for a decision.
func (g *Guard) freeze(ctx context.Context, q querier, c *call) error {
	approval := "none"
	if c.tool.NeedsApproval {
		approval = "waiting"
	}
	_, err := q.Exec(ctx, g.q.insert, c.ref.Tenant, string(c.ref.Key), c.ref.Task, c.ref.Step, c.ref.Tool, string(c.args),
		string(c.in.Fingerprint), g.now(), pgsql.Interval(g.cfg.Retention), approval, pgsql.Interval(g.cfg.ApprovalTimeout))
	return err
}

// stored is a call's row.
type stored struct {
	args, fingerprint, approval string
	deadline                    *time.Time
	timedOut                    bool
	by, reason                  string
}

// lookup reads the call's row, or nil if there is none.
func (g *Guard) lookup(ctx context.Context, q querier, ref CallRef) (*stored, error) {
	var s stored
	var task, step, tool string
	err := q.QueryRow(ctx, g.q.read, ref.Tenant, string(ref.Key), g.now()).
		Scan(&task, &step, &tool, &s.args, &s.fingerprint, &s.approval, &s.deadline, &s.timedOut, &s.by, &s.reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("oncekit/agent: read %s: %w", ref, err)
	}
	return &s, nil
}

// changed returns the ArgumentsChangedError of c, with the arguments stored for its key.
func (g *Guard) changed(ctx context.Context, c *call) error {
	e := &ArgumentsChangedError{Call: c.ref, New: c.args}
	if s, err := g.lookup(ctx, g.pool, c.ref); err == nil && s != nil {
		e.Stored = json.RawMessage(s.args)
	}
	return e
}

// Call makes a tool call of t at step, once: the first call runs fn and stores its
// output; every later call with the same arguments returns the stored output with
// Result.Replayed set and does not run fn; a later call with other arguments is refused
// with an [*ArgumentsChangedError]. The call claims its key (and renews t's claim, or is
// refused with a [*StaleOwnerError]) in one transaction that commits before fn runs,
// and records fn's outcome after: fn may act outside the database, such as an HTTP call.
//
// A call whose earlier attempt died or lost its answer is made again with the same
// [Invocation].DownstreamKey when the tool accepts a key; otherwise it is reported with
// an [*UncertainError] and fn does not run. An output over the ledger's body limit
// cannot be stored, and counts as an answer that was lost. When the claim's commit goes
// unanswered, Call returns an error that wraps a ledger.OutcomeUnknownError before fn
// starts; a retry in the same process resumes the claim. When the answer to the commit
// that stores fn's output is lost, Call returns such an error too, after fn ran: it is
// unknown whether the output was recorded, and a retry replays it if it was, or, once
// the call's lease ran out, treats the call as one that may have happened (made again
// with the same downstream key, or reported uncertain).
func (t *Task) Call(ctx context.Context, step string, tool Tool, args json.RawMessage, fn ToolFunc, opts *CallOpts) (Result, error) {
	g := t.g
	c, err := g.open(ctx, t, step, tool, args, fn == nil)
	if err != nil {
		return c.result(), err
	}
	if g.unguarded(tool) {
		out, err := fn(ctx, c.inv)
		return Result{Call: c.ref, Output: out, Unguarded: true}, err
	}
	claim, err := g.claim(ctx, t, c, callOpts(opts))
	if err != nil {
		return Result{Call: c.ref}, err
	}
	if claim.Lease == nil {
		return Result{Call: c.ref, Output: claim.Result.Body, Replayed: true}, nil
	}
	lease := claim.Lease
	rctx := context.WithoutCancel(ctx)
	c.inv.Attempt, c.inv.Redrive = lease.Attempt, lease.Redrive
	if lease.Redrive && !tool.AcceptsKey {
		// An earlier attempt may have acted: keep the record uncertain for the operator.
		err := g.l.MarkUncertain(rctx, lease)
		if errors.Is(err, ledger.ErrLeaseLost) {
			// Yet another attempt took the call over meanwhile: it is as uncertain for
			// this one, which started nothing.
			return Result{Call: c.ref}, g.uncertain(ctx, c, lease.Attempt, err)
		}
		if err != nil {
			return Result{Call: c.ref}, err
		}
		return Result{Call: c.ref}, g.uncertain(ctx, c, lease.Attempt, nil)
	}
	out, callErr := fn(ctx, c.inv)
	switch faultpoint.At(ctx, faultpoint.AfterCall, out, callErr) {
	case faultpoint.Crash:
		// A test's fault plan: the agent dies before it records anything, and its
		// lease runs out as that of a dead agent would.
		_ = g.l.Extend(rctx, lease, time.Millisecond)
		return Result{Call: c.ref}, faultpoint.ErrCrashed
	case faultpoint.LoseAnswer:
		if callErr == nil {
			out, callErr = nil, faultpoint.ErrLostAnswer
		}
	}
	if callErr == nil {
		if len(out) == 0 {
			out = json.RawMessage("null")
		}
		_, err := g.l.Complete(rctx, lease, ledger.Response{Body: out})
		switch {
		case err == nil:
			return Result{Call: c.ref, Output: out}, nil
		case errors.Is(err, ledger.ErrBodyTooLarge):
			// The tool acted and its output cannot be stored: as with an answer that was
			// lost, the call is recorded as one that may have happened.
			callErr = fmt.Errorf("oncekit/agent: the tool acted and its output is over the ledger's body limit: %w", err)
		case errors.Is(err, ledger.ErrLeaseLost):
			return Result{Call: c.ref}, g.takenOver(ctx, c, lease.Attempt, err)
		default:
			return Result{Call: c.ref}, err
		}
	}
	var derr *ledger.DefinitiveError
	var na *ledger.NotAppliedError
	switch {
	case errors.As(callErr, &derr):
		if err := g.l.Fail(rctx, lease, derr); err != nil {
			return Result{Call: c.ref}, errors.Join(callErr, err)
		}
		return Result{Call: c.ref}, callErr
	case errors.As(callErr, &na):
		if err := g.l.Release(rctx, lease); err != nil {
			return Result{Call: c.ref}, errors.Join(callErr, err)
		}
		return Result{Call: c.ref}, callErr
	default:
		err := g.l.MarkUncertain(rctx, lease)
		if errors.Is(err, ledger.ErrLeaseLost) {
			return Result{Call: c.ref}, g.takenOver(ctx, c, lease.Attempt, errors.Join(callErr, err))
		}
		if err != nil {
			return Result{Call: c.ref}, errors.Join(callErr, err)
		}
		if tool.AcceptsKey {
			return Result{Call: c.ref}, fmt.Errorf("oncekit/agent: %s failed and may have happened; a retry makes it again with the same downstream key: %w", c.ref, callErr)
		}
		return Result{Call: c.ref}, g.uncertain(ctx, c, lease.Attempt, callErr)
	}
}

func (g *Guard) uncertain(ctx context.Context, c *call, attempt int, err error) error {
	g.log.LogAttrs(ctx, slog.LevelWarn, "oncekit: a tool call may have happened and is not repeated; settle it with Guard.Resolve",
		slog.String(ledger.AttrTenant, c.ref.Tenant), slog.String("oncekit.task", c.ref.Task),
		slog.String("oncekit.step", c.ref.Step), slog.String("oncekit.tool", c.ref.Tool), slog.Int("oncekit.attempt", attempt),
		slog.String("oncekit.reason", reason(err)))
	return &UncertainError{Call: c.ref, Attempt: attempt, Err: err}
}

// takenOver is the answer of an attempt whose tool ran and whose call another attempt
// took over (its lease had run out) before this one recorded the outcome: the call may
// have happened, and what is recorded is the other attempt's to say.
func (g *Guard) takenOver(ctx context.Context, c *call, attempt int, err error) error {
	return g.uncertain(ctx, c, attempt, fmt.Errorf("another attempt took the call over before its outcome was recorded: %w", err))
}

// reason is the error a call met, shortened for a log, or what an attempt that met
// none says: an earlier attempt made the call.
func reason(err error) string {
	if err == nil {
		return "an earlier attempt made the call and recorded no outcome"
	}
	return clip([]byte(err.Error()))
}

func callOpts(opts *CallOpts) CallOpts {
	if opts == nil {
		return CallOpts{}
	}
	return *opts
}

// claim claims the call's key in one transaction with t's fence and the call's frozen
// arguments, and commits it. A duplicate in flight is waited for outside any
// transaction, so that waiting calls hold no connection the call they wait for needs.
func (g *Guard) claim(ctx context.Context, t *Task, c *call, o CallOpts) (ledger.ClaimResult, error) {
	start := time.Now()
	backoff := 5 * time.Millisecond
	for {
		claim, err := g.claimOnce(ctx, t, c)
		var busy *ledger.InProgressError
		if !errors.As(err, &busy) {
			return claim, err
		}
		left := o.Wait - time.Since(start)
		if left <= 0 {
			busy.Waited = time.Since(start)
			return claim, busy
		}
		timer := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ledger.ClaimResult{}, ctx.Err()
		case <-timer.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// lockCall takes, in tx, the call's transaction-scoped advisory lock: every
// transaction that claims a call takes it first, so they take the task's, the
// record's and the arguments' row locks one at a time and in one order, whichever
// path they take (a first claim, a take-over, a resumed lost claim), and never
// deadlock. The lock is held for a transaction's few statements, never while a tool
// runs.
func (g *Guard) lockCall(ctx context.Context, tx pgx.Tx, c *call) error {
	key := pgsql.LockKey("oncekit/agent", g.l.Schema(), c.ref.Tenant, string(c.ref.Key))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		return fmt.Errorf("oncekit/agent: lock %s: %w", c.ref, err)
	}
	return nil
}

func (g *Guard) claimOnce(ctx context.Context, t *Task, c *call) (_ ledger.ClaimResult, err error) {
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return ledger.ClaimResult{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := g.lockCall(ctx, tx, c); err != nil {
		return ledger.ClaimResult{}, err
	}
	fenced, err := t.fence(ctx, tx)
	if err != nil {
		return ledger.ClaimResult{}, err
	}
	var claim ledger.ClaimResult
	frozen := false
	lost, busy := g.lost.take(c)
	if busy {
		// Another retry in this process is resuming the call's lost claim.
		return ledger.ClaimResult{}, &ledger.InProgressError{Scope: c.in.Scope, Key: c.in.Key}
	}
	if lost != nil {
		resumed := false
		defer func() {
			// Kept for the next retry unless it was resumed and committed, or is no
			// longer the key's; a lost answer again keeps it too.
			g.lost.done(c, lost, !resumed || err != nil)
		}()
		// The call's lock is held: a transaction still committing the lost claim has
		// ended, and the record read next is as it left it.
		if err := g.freeze(ctx, tx, c); err != nil {
			return ledger.ClaimResult{}, err
		}
		frozen = true
		resumed, err = g.resume(ctx, tx, lost)
		if err != nil {
			return ledger.ClaimResult{}, err
		}
		if resumed {
			claim = ledger.ClaimResult{Lease: lost, Result: ledger.Result{Attempts: lost.Attempt}}
		} else {
			g.lost.done(c, lost, false)
		}
	}
	if claim.Lease == nil {
		claim, err = g.l.ClaimTx(ctx, tx, c.in, &ledger.ClaimOpts{Lease: g.cfg.CallLease, Wait: ledger.NoWait})
		if errors.Is(err, ledger.ErrFingerprintMismatch) {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return ledger.ClaimResult{}, g.changed(ctx, c)
		}
		if err != nil {
			return claim, err
		}
	}
	if claim.Lease == nil {
		// A replay: commit the fence's renewal of the task's claim, if any.
		if t.lease != nil {
			if err := tx.Commit(ctx); err != nil {
				return ledger.ClaimResult{}, fmt.Errorf("oncekit/agent: renew the claim of task %q: %w", t.ID, err)
			}
			t.renewed(fenced)
		}
		return claim, nil
	}
	if !frozen {
		if err := g.freeze(ctx, tx, c); err != nil {
			return ledger.ClaimResult{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if pgsql.CommitUnknown(err) {
			// The claim may have committed, and the tool has not started: a retry in this
			// process resumes the claim and runs the tool, rather than take the claim
			// over as an attempt that may have acted.
			g.lost.put(c, claim.Lease)
			err = &ledger.OutcomeUnknownError{Scope: c.in.Scope, Key: c.in.Key, Token: claim.Lease.Token, Err: err}
		}
		return ledger.ClaimResult{}, fmt.Errorf("oncekit/agent: commit the claim of %s: %w", c.ref, err)
	}
	t.renewed(fenced)
	return claim, nil
}

// CallTx makes a tool call that writes only to the database: fn runs in the
// transaction that records the call, so its writes and the record commit together or
// not at all, and a crash leaves the call to be made afresh. Replays, changed
// arguments and stale owners are as in [Task.Call].
func (t *Task) CallTx(ctx context.Context, step string, tool Tool, args json.RawMessage, fn LocalFunc, opts *CallOpts) (Result, error) {
	g := t.g
	c, err := g.open(ctx, t, step, tool, args, fn == nil)
	if err != nil {
		return c.result(), err
	}
	o := callOpts(opts)
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return Result{Call: c.ref}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := g.lockCall(ctx, tx, c); err != nil {
		return Result{Call: c.ref}, err
	}
	fenced, err := t.fence(ctx, tx)
	if err != nil {
		return Result{Call: c.ref}, err
	}
	if err := g.freeze(ctx, tx, c); err != nil {
		return Result{Call: c.ref}, err
	}
	ran := false
	res, err := g.l.DoTx(ctx, tx, c.in, func(ctx context.Context, tx pgx.Tx) (ledger.Response, error) {
		ran = true
		inv := c.inv
		inv.Attempt = 1
		out, err := fn(ctx, tx, inv)
		if err == nil && len(out) == 0 {
			out = json.RawMessage("null")
		}
		return ledger.Response{Body: out}, err
	}, &ledger.DoOpts{Wait: o.Wait, Mode: ledger.ModeClaimFirst})
	var derr *ledger.DefinitiveError
	switch {
	case errors.Is(err, ledger.ErrFingerprintMismatch):
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return Result{Call: c.ref}, g.changed(ctx, c)
	case errors.As(err, &derr) && !derr.Replayed:
		// A stored failure commits with the call's record.
	case err != nil:
		return Result{Call: c.ref}, err
	}
	if ran && !res.Replayed && faultpoint.At(ctx, faultpoint.BeforeCommit, res, err) == faultpoint.Crash {
		return Result{Call: c.ref}, faultpoint.ErrCrashed
	}
	if cerr := tx.Commit(ctx); cerr != nil {
		return Result{Call: c.ref}, fmt.Errorf("oncekit/agent: commit %s: %w", c.ref, cerr)
	}
	t.renewed(fenced)
	if err != nil {
		return Result{Call: c.ref}, err
	}
	return Result{Call: c.ref, Output: res.Body, Replayed: res.Replayed}, nil
}

package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// purposeDefault is the purpose activity.External derives its downstream key with
// (activity.PurposeDefault; the command does not import package activity, which would
// bring Temporal's SDK into it).
const purposeDefault = "downstream"

// maxListLimit bounds --limit.
const maxListLimit = 1000

func (a *app) ledger() (*ledger.Ledger, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	return ledger.New(a.pool, &ledger.Config{Schema: a.schema})
}

// dbNow is the database's clock, by which leases and expiry are reckoned.
func (a *app) dbNow() time.Time {
	var now time.Time
	if err := a.pool.QueryRow(a.ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Now()
	}
	return now
}

// recordView is a record as the command shows it.
type recordView struct {
	Tenant        string     `json:"tenant"`
	Operation     string     `json:"operation"`
	Key           string     `json:"key"`
	KeyParts      string     `json:"key_parts,omitempty"`
	State         string     `json:"state"`
	Stuck         bool       `json:"stuck"`
	Expired       bool       `json:"expired"`
	Fingerprint   string     `json:"fingerprint"`
	StatusCode    int        `json:"status_code"`
	BodyBytes     int        `json:"body_bytes"`
	BodySHA256    string     `json:"body_sha256,omitempty"`
	Body          *string    `json:"body,omitempty"`
	BodyBase64    *string    `json:"body_base64,omitempty"`
	ResourceRef   string     `json:"resource_ref,omitempty"`
	ErrorCode     string     `json:"error_code,omitempty"`
	ErrorMessage  string     `json:"error_message,omitempty"`
	OwnerToken    string     `json:"owner_token,omitempty"`
	LeaseUntil    *time.Time `json:"lease_until,omitempty"`
	LeaseLive     bool       `json:"lease_live"`
	Uncertain     bool       `json:"uncertain"`
	Attempts      int        `json:"attempts"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	ExpiresAt     time.Time  `json:"expires_at"`
	DownstreamKey string     `json:"downstream_key,omitempty"`
}

// view shows r; its body only when showBody is set, its size and digest always.
func view(r ledger.Record, showBody bool) recordView {
	v := recordView{Tenant: r.Scope.Tenant, Operation: r.Scope.Operation, Key: string(r.Key), KeyParts: describeKey(r.Key),
		State: string(r.State), Stuck: r.State == ledger.StatePending && r.LeaseExpired, Expired: r.Expired,
		Fingerprint: string(r.Fingerprint), StatusCode: r.Response.Code, BodyBytes: len(r.Response.Body),
		ResourceRef: r.Response.ResourceRef, ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage, Uncertain: r.Uncertain,
		Attempts: r.Attempts, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt}
	if len(r.Response.Body) > 0 {
		sum := sha256.Sum256(r.Response.Body)
		v.BodySHA256 = hex.EncodeToString(sum[:])
	}
	if showBody && r.Response.Body != nil {
		if utf8.Valid(r.Response.Body) {
			s := string(r.Response.Body)
			v.Body = &s
		} else {
			s := base64.StdEncoding.EncodeToString(r.Response.Body)
			v.BodyBase64 = &s
		}
	}
	if r.State == ledger.StatePending {
		v.OwnerToken = r.OwnerToken.String()
		if !r.LeaseUntil.IsZero() {
			lu := r.LeaseUntil
			v.LeaseUntil = &lu
		}
		v.LeaseLive = !r.LeaseExpired
	}
	return v
}

// stateText is the state with what it means now: expired, stuck, lease left.
func (v recordView) stateText(now time.Time) string {
	s := v.State
	switch {
	case v.Stuck && v.LeaseUntil != nil:
		s += fmt.Sprintf(" (stuck: its lease ran out %s)", ago(*v.LeaseUntil, now))
	case v.LeaseLive && v.LeaseUntil != nil:
		s += fmt.Sprintf(" (lease live, %s left)", v.LeaseUntil.Sub(now).Round(time.Second))
	}
	if v.Expired {
		s += " (expired: counts as absent)"
	}
	return s
}

func (a *app) inspectCommand() *cobra.Command {
	var showBody bool
	var purpose string
	cmd := &cobra.Command{
		Use:   "inspect TENANT OPERATION KEY",
		Short: "Show one record, its downstream key and its audit rows",
		Long: `inspect shows the record of KEY in TENANT's OPERATION: its state (marked when it expired,
and, for a pending record, its owner and the time its lease has left or ran out since),
what the key is made of, the downstream key an activity sent its provider (what to ask the
provider about), the stored result (the body's size and SHA-256; the body itself only with
--show-body), and the audit rows of every release and eviction of the key, kept even when
the record is gone.`,
		Args: args(3, "TENANT OPERATION KEY"),
		RunE: a.runE(func(_ *cobra.Command, args []string) error {
			if _, err := keys.Derive("k", purpose); err != nil {
				return usageError{fmt.Sprintf("--purpose: %v", err)}
			}
			return a.inspect(keys.Scope{Tenant: args[0], Operation: args[1]}, keys.Key(args[2]), showBody, purpose)
		}),
	}
	cmd.Flags().BoolVar(&showBody, "show-body", false, "print the stored body (it may hold customer data); without it, its size and SHA-256")
	cmd.Flags().StringVar(&purpose, "purpose", purposeDefault, "the purpose the activity derived its downstream key with (activity.Opts.Purpose)")
	return cmd
}

// inspectView is what inspect prints.
type inspectView struct {
	Record *recordView `json:"record"`
	Audit  []auditView `json:"audit"`
	Now    time.Time   `json:"now"`
}

// auditView is an audit row as the command shows it.
type auditView struct {
	ID     int64      `json:"id"`
	At     time.Time  `json:"at"`
	Action string     `json:"action"`
	Actor  string     `json:"actor"`
	DBUser string     `json:"db_user"`
	Reason string     `json:"reason"`
	Forced bool       `json:"forced"`
	Before recordView `json:"before"`
}

func auditOf(e ledger.AuditEntry) auditView {
	before := view(e.Before, false)
	before.BodyBytes, before.BodySHA256 = e.BodyBytes, e.BodySHA256
	before.Stuck, before.Expired, before.LeaseLive = false, false, false
	return auditView{ID: e.ID, At: e.At, Action: string(e.Action), Actor: e.Actor, DBUser: e.DBUser, Reason: e.Reason,
		Forced: e.Forced, Before: before}
}

func (a *app) inspect(scope keys.Scope, key keys.Key, showBody bool, purpose string) error {
	if err := validRecordID(scope, key); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	iv := inspectView{Audit: []auditView{}, Now: a.dbNow()}
	entries, err := l.Audit(a.ctx, scope, key)
	if err != nil {
		return err
	}
	for _, e := range entries {
		iv.Audit = append(iv.Audit, auditOf(e))
	}
	r, err := l.Get(a.ctx, scope, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
	case err != nil:
		return err
	default:
		v := view(*r, showBody)
		if dk, err := keys.DeriveIn(scope, key, purpose); err == nil {
			v.DownstreamKey = string(dk)
		}
		iv.Record = &v
	}
	if iv.Record == nil && len(iv.Audit) == 0 {
		return notFound(scope, key)
	}
	if err := a.emit(iv, func(w *tabwriter.Writer) { printInspect(w, iv, purpose) }); err != nil {
		return err
	}
	if iv.Record == nil {
		return exitError{exitNotFound, fmt.Sprintf("no record of key %q in %s now; its audit rows are above", key, scope)}
	}
	return nil
}

func notFound(scope keys.Scope, key keys.Key) error {
	return exitError{exitNotFound, fmt.Sprintf("no record of key %q in %s, and no audit row (check the tenant and operation: oncekit list --tenant %s shows what there is)",
		key, scope, scope.Tenant)}
}

// validRecordID refuses a tenant, operation or key the ledger would refuse, before
// connecting, with what is wrong.
func validRecordID(scope keys.Scope, key keys.Key) error {
	if err := scope.Validate(); err != nil {
		return usageError{err.Error()}
	}
	if err := key.ValidateLen(ledger.MaxKeyLenLimit); err != nil {
		return usageError{err.Error()}
	}
	return nil
}

func printInspect(w *tabwriter.Writer, iv inspectView, purpose string) {
	if v := iv.Record; v != nil {
		fmt.Fprintf(w, "tenant\t%s\noperation\t%s\nkey\t%s\n", v.Tenant, v.Operation, v.Key)
		if v.KeyParts != "" {
			fmt.Fprintf(w, "key parts\t%s\n", v.KeyParts)
		}
		fmt.Fprintf(w, "state\t%s\n", v.stateText(iv.Now))
		if v.State == string(ledger.StatePending) {
			fmt.Fprintf(w, "owner\t%s\n", v.OwnerToken)
			if v.LeaseUntil != nil {
				fmt.Fprintf(w, "lease until\t%s\n", rfc3339(*v.LeaseUntil))
			}
		}
		fmt.Fprintf(w, "fingerprint\t%s\n", v.Fingerprint)
		switch v.State {
		case string(ledger.StateFailed):
			fmt.Fprintf(w, "error\t%s: %s\n", v.ErrorCode, v.ErrorMessage)
		case string(ledger.StateCompleted):
			fmt.Fprintf(w, "status\t%d\n", v.StatusCode)
			switch {
			case v.Body != nil:
				fmt.Fprintf(w, "body\t%d bytes: %s\n", v.BodyBytes, *v.Body)
			case v.BodyBase64 != nil:
				fmt.Fprintf(w, "body\t%d bytes, base64: %s\n", v.BodyBytes, *v.BodyBase64)
			case v.BodyBytes > 0:
				fmt.Fprintf(w, "body\t%d bytes, sha256 %s (--show-body prints it)\n", v.BodyBytes, v.BodySHA256)
			default:
				fmt.Fprintf(w, "body\tnone\n")
			}
		}
		if v.ResourceRef != "" {
			fmt.Fprintf(w, "resource\t%s\n", v.ResourceRef)
		}
		fmt.Fprintf(w, "uncertain\t%v\nattempts\t%d\n", v.Uncertain, v.Attempts)
		fmt.Fprintf(w, "created\t%s (%s)\nupdated\t%s\n", rfc3339(v.CreatedAt), ago(v.CreatedAt, iv.Now), rfc3339(v.UpdatedAt))
		expires := rfc3339(v.ExpiresAt)
		if v.Expired {
			expires += " (expired " + ago(v.ExpiresAt, iv.Now) + ": the next request with the key runs again)"
		}
		fmt.Fprintf(w, "expires\t%s\n", expires)
		fmt.Fprintf(w, "downstream key\t%s (what an activity sent its provider, derived with purpose %q)\n", v.DownstreamKey, purpose)
	}
	if len(iv.Audit) == 0 {
		fmt.Fprintf(w, "audit\tnone: no operator changed this key\n")
	}
	for _, e := range iv.Audit {
		forced := ""
		if e.Forced {
			forced = " by force, its lease live"
		}
		fmt.Fprintf(w, "audit\t%s %s%s by %s (database role %s): %q; it was %s, owner %s, attempts %d, created %s\n",
			rfc3339(e.At), pastTense(e.Action), forced, e.Actor, e.DBUser, e.Reason, e.Before.State, orDash(e.Before.OwnerToken),
			e.Before.Attempts, rfc3339(e.Before.CreatedAt))
	}
}

func pastTense(action string) string {
	if action == string(ledger.ActionRelease) {
		return "released"
	}
	return "evicted"
}

func orDash(s string) string {
	if s == "" || s == "00000000-0000-0000-0000-000000000000" {
		return "-"
	}
	return s
}

// filters are the flags that choose records, for list and the bulk release and evict.
type filters struct {
	state, tenant, operation, since, until, keyPrefix, after string
	olderThan                                                time.Duration
	stuck                                                    bool
	id                                                       identity
	limit                                                    int
}

func (f *filters) register(fs *pflag.FlagSet, paging bool) {
	fs.StringVar(&f.state, "state", "", "only records in this state: pending, completed or failed")
	fs.BoolVar(&f.stuck, "stuck", false, "only pending records whose lease ran out")
	fs.StringVar(&f.tenant, "tenant", "", "only this tenant's records")
	fs.StringVar(&f.operation, "operation", "", "only this operation's records")
	fs.DurationVar(&f.olderThan, "older-than", 0, "only records created at least this long ago, such as 2h")
	fs.StringVar(&f.since, "since", "", "only records created at or after this time: RFC 3339 (2025-01-02T15:04:05Z) or a duration ago (90m)")
	fs.StringVar(&f.until, "until", "", "only records created before this time: RFC 3339 or a duration ago")
	fs.StringVar(&f.keyPrefix, "key-prefix", "", "only records whose key starts with this")
	fs.StringVar(&f.id.workflowID, "workflow-id", "", "only activity keys of this workflow (workflow-scoped keys, and a saga's default key)")
	fs.StringVar(&f.id.runID, "run-id", "", "only activity keys of this workflow run (run-scoped keys, and a saga's default key)")
	fs.StringVar(&f.id.activityID, "activity-id", "", "only activity keys of this activity ID")
	fs.IntVar(&f.limit, "limit", 100, fmt.Sprintf("at most this many records, 1 to %d", maxListLimit))
	if paging {
		fs.StringVar(&f.after, "after", "", "the cursor a previous page printed: list the records after it")
	}
}

func (f *filters) any() bool {
	return f.state != "" || f.tenant != "" || f.operation != "" || f.olderThan != 0 || f.since != "" || f.until != "" ||
		f.keyPrefix != "" || !f.id.empty() || f.stuck
}

// opts turns the flags into ledger.ListOpts, refusing what does not parse.
func (f *filters) opts(now time.Time) (ledger.ListOpts, error) {
	o := ledger.ListOpts{Tenant: f.tenant, Operation: f.operation, OlderThan: f.olderThan, Stuck: f.stuck, KeyPrefix: f.keyPrefix, Limit: f.limit}
	if f.limit <= 0 || f.limit > maxListLimit {
		return o, usageError{fmt.Sprintf("--limit %d: give 1 to %d", f.limit, maxListLimit)}
	}
	if f.olderThan < 0 {
		return o, usageError{"--older-than must not be negative"}
	}
	switch ledger.State(f.state) {
	case "", ledger.StatePending, ledger.StateCompleted, ledger.StateFailed:
		o.State = ledger.State(f.state)
	default:
		return o, usageError{fmt.Sprintf("--state %q: use pending, completed or failed", bounded(f.state))}
	}
	var err error
	if o.CreatedAfter, err = parseWhen("--since", f.since, now); err != nil {
		return o, err
	}
	if o.CreatedBefore, err = parseWhen("--until", f.until, now); err != nil {
		return o, err
	}
	if o.KeyPatterns, err = f.id.patterns(); err != nil {
		return o, err
	}
	if f.after != "" {
		if o.After, err = decodeCursor(f.after); err != nil {
			return o, err
		}
	}
	return o, nil
}

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

// cursor is where a page of list ends: the last record's sort key.
type cursor struct {
	CreatedAt time.Time `json:"c"`
	Tenant    string    `json:"t"`
	Operation string    `json:"o"`
	Key       string    `json:"k"`
}

func encodeCursor(r ledger.Record) string {
	b, _ := json.Marshal(cursor{CreatedAt: r.CreatedAt, Tenant: r.Scope.Tenant, Operation: r.Scope.Operation, Key: string(r.Key)})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (*ledger.Record, error) {
	bad := usageError{"--after: not a cursor list printed (copy it whole from the previous page)"}
	if len(s) > 8192 {
		return nil, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || c.CreatedAt.IsZero() {
		return nil, bad
	}
	return &ledger.Record{CreatedAt: c.CreatedAt, Scope: keys.Scope{Tenant: c.Tenant, Operation: c.Operation}, Key: keys.Key(c.Key)}, nil
}

func (a *app) listCommand() *cobra.Command {
	var f filters
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List records, newest first, found by tenant, operation, state, time, key or Temporal IDs",
		Long: `list shows records newest first. Filters combine. Activity keys are made of Temporal
identities (run ID and activity ID by default, workflow ID and activity ID when
workflow-scoped), so --workflow-id, --run-id and --activity-id find an activity's records;
a saga's default key holds its workflow ID and original run ID. When more records match
than --limit, list says so and prints the --after cursor of the next page (in JSON,
next_cursor). It reads the table: on a large one, narrow by --tenant and --operation.`,
		Args: args(0, ""),
		RunE: a.runE(func(*cobra.Command, []string) error { return a.list(&f) }),
	}
	f.register(cmd.Flags(), true)
	return cmd
}

// listView is what list prints.
type listView struct {
	Records    []recordView `json:"records"`
	More       bool         `json:"more"`
	NextCursor *string      `json:"next_cursor"`
}

func (a *app) list(f *filters) error {
	if _, err := f.opts(time.Now()); err != nil {
		return err // before connecting
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	now := a.dbNow()
	o, err := f.opts(now)
	if err != nil {
		return err
	}
	o.Limit++
	recs, err := l.List(a.ctx, &o)
	if err != nil {
		return err
	}
	lv := listView{Records: []recordView{}}
	if len(recs) > f.limit {
		recs = recs[:f.limit]
		lv.More = true
		c := encodeCursor(recs[len(recs)-1])
		lv.NextCursor = &c
	}
	for _, r := range recs {
		lv.Records = append(lv.Records, view(r, false))
	}
	err = a.emit(lv, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "TENANT\tOPERATION\tKEY\tSTATE\tATTEMPTS\tCREATED")
		for _, v := range lv.Records {
			state := v.State
			switch {
			case v.Stuck:
				state += " (stuck)"
			case v.LeaseLive:
				state += " (lease live)"
			}
			if v.Expired {
				state += " (expired)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", v.Tenant, v.Operation, v.Key, state, v.Attempts, rfc3339(v.CreatedAt))
		}
	})
	if err == nil && lv.More && !a.json {
		fmt.Fprintf(a.errOut, "oncekit: more records match: add --after %s for the next page\n", *lv.NextCursor)
	}
	return err
}

func (a *app) changeCommand(action ledger.Action) *cobra.Command {
	var f filters
	var reason, who string
	var yes, force bool
	cmd := &cobra.Command{
		Use: string(action) + " [TENANT OPERATION KEY]",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 0 && len(args) != 3 {
				return usageError{fmt.Sprintf("%s takes TENANT OPERATION KEY, or no argument and filters (got %d arguments)", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: a.runE(func(_ *cobra.Command, args []string) error {
			if who == "" {
				who = actor()
			}
			c := change{action: action, reason: reason, actor: who, yes: yes, force: force}
			if len(args) == 3 {
				if f.any() {
					return usageError{"give TENANT OPERATION KEY or filters, not both"}
				}
				return a.changeOne(c, keys.Scope{Tenant: args[0], Operation: args[1]}, keys.Key(args[2]))
			}
			if !f.any() {
				return usageError{fmt.Sprintf("%s needs TENANT OPERATION KEY, or filters that choose records (--tenant, --operation, --older-than, ...)", action)}
			}
			return a.changeMany(c, &f)
		}),
	}
	if action == ledger.ActionRelease {
		cmd.Short = "Delete a pending record stuck in progress, so the next attempt starts afresh"
		cmd.Long = `release deletes a pending record: the claim of an external call whose owner is gone.
The next attempt claims the key afresh and makes its external call again, with the same
downstream key, so a provider that deduplicates by it does not charge twice.

Without --yes it shows the record (owner, lease, attempts) and changes nothing. A record
whose lease is live is refused unless --force: its attempt may still be running. With
filters instead of TENANT OPERATION KEY it releases every pending record they choose
whose lease ran out (with --force, live ones too), after the same dry run. Each release
keeps an audit row, with --reason, that inspect shows.`
		cmd.Flags().BoolVar(&force, "force", false, "release a record whose lease is live: only when its owner is known to be gone")
	} else {
		cmd.Short = "Delete a completed or failed record, so the next request with its key runs again"
		cmd.Long = `evict deletes a completed or failed record: a stored result known to be wrong. The
next request with the key runs again instead of replaying it.

Without --yes it shows the record and changes nothing. With filters instead of TENANT
OPERATION KEY it evicts every completed or failed record they choose (--state narrows to
one), after the same dry run. Each eviction keeps an audit row, with --reason, that
inspect shows.`
	}
	fl := cmd.Flags()
	fl.StringVar(&reason, "reason", "", "why, such as the incident's reference; required with --yes, kept in the audit row")
	fl.StringVar(&who, "actor", "", "who makes the change, kept in the audit row (default: the OS user and host, such as alice@bastion)")
	fl.BoolVarP(&yes, "yes", "y", false, "make the change; without it, show what would change")
	f.register(fl, false)
	return cmd
}

// change is a release or eviction as the command line asks it.
type change struct {
	action        ledger.Action
	reason, actor string
	yes, force    bool
}

// planView is what release and evict print: what they would change, or did.
type planView struct {
	Action  string       `json:"action"`
	DryRun  bool         `json:"dry_run"`
	Records []recordView `json:"records"`
	// Refused are records chosen that the change does not apply to, with why.
	Refused []refusal   `json:"refused"`
	Done    []auditView `json:"done"`
	More    bool        `json:"more"`
}

type refusal struct {
	Tenant    string `json:"tenant"`
	Operation string `json:"operation"`
	Key       string `json:"key"`
	Reason    string `json:"reason"`
}

func (c change) check() error {
	if c.yes && c.reason == "" {
		return usageError{fmt.Sprintf("%s --yes needs --reason: say why, such as the incident's reference; it is kept in the audit row", c.action)}
	}
	if len(c.reason) > ledger.MaxReasonLen || len(c.actor) > ledger.MaxActorLen {
		return usageError{fmt.Sprintf("--reason and --actor are at most %d and %d bytes", ledger.MaxReasonLen, ledger.MaxActorLen)}
	}
	return nil
}

func (a *app) changeOne(c change, scope keys.Scope, key keys.Key) error {
	if err := validRecordID(scope, key); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	r, err := l.Get(a.ctx, scope, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFound(scope, key)
	}
	if err != nil {
		return err
	}
	if (r.State == ledger.StatePending) != (c.action == ledger.ActionRelease) {
		return exitError{exitWrongState, strings.TrimPrefix((&ledger.WrongStateError{Scope: scope, Key: key, Action: c.action, State: r.State}).Error(), "oncekit/ledger: ")}
	}
	return a.apply(l, c, []ledger.Record{*r}, false)
}

func (a *app) changeMany(c change, f *filters) error {
	if err := c.check(); err != nil {
		return err
	}
	if _, err := f.opts(time.Now()); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	o, err := f.opts(a.dbNow())
	if err != nil {
		return err
	}
	var states []ledger.State
	switch {
	case c.action == ledger.ActionRelease:
		if o.State != "" && o.State != ledger.StatePending {
			return usageError{"release applies to pending records: drop --state, or evict instead"}
		}
		states = []ledger.State{ledger.StatePending}
		o.Stuck = o.Stuck || !c.force // without --force, only those whose lease ran out
	case o.State == ledger.StatePending:
		return usageError{"evict applies to completed and failed records: a pending record is released"}
	case o.State != "":
		states = []ledger.State{o.State}
	default:
		states = []ledger.State{ledger.StateCompleted, ledger.StateFailed}
	}
	var recs []ledger.Record
	more := false
	for _, s := range states {
		o := o
		o.State, o.Limit = s, f.limit+1
		got, err := l.List(a.ctx, &o)
		if err != nil {
			return err
		}
		recs = append(recs, got...)
	}
	if len(recs) > f.limit {
		recs, more = recs[:f.limit], true
	}
	return a.apply(l, c, recs, more)
}

// apply shows the records c would change, and, with --yes, changes each one that is
// still as shown, keeping its audit row.
func (a *app) apply(l *ledger.Ledger, c change, recs []ledger.Record, more bool) error {
	now := a.dbNow()
	pv := planView{Action: string(c.action), DryRun: !c.yes, Records: []recordView{}, Refused: []refusal{}, Done: []auditView{}, More: more}
	var targets []ledger.Record
	for _, r := range recs {
		v := view(r, false)
		pv.Records = append(pv.Records, v)
		if c.action == ledger.ActionRelease && !r.LeaseExpired && !c.force {
			pv.Refused = append(pv.Refused, refusal{v.Tenant, v.Operation, v.Key,
				fmt.Sprintf("its lease is live (%s left, owner %s): its attempt may still be running; wait for the lease to run out, or add --force if that owner is known to be gone",
					r.LeaseUntil.Sub(now).Round(time.Second), r.OwnerToken)})
			continue
		}
		targets = append(targets, r)
	}
	if c.yes {
		for _, r := range targets {
			r := r
			entry, err := l.Change(a.ctx, c.action, r.Scope, r.Key, &ledger.ChangeOpts{Actor: c.actor, Reason: c.reason, Force: c.force, Expect: &r})
			var changed *ledger.RecordChangedError
			switch {
			case err == nil:
				pv.Done = append(pv.Done, auditOf(entry))
			case errors.Is(err, ledger.ErrNotFound), errors.As(err, &changed):
				pv.Refused = append(pv.Refused, refusal{r.Scope.Tenant, r.Scope.Operation, string(r.Key),
					"it changed since it was read, and was left as it is: look at it again"})
			default:
				return err
			}
		}
	}
	err := a.emit(pv, func(w *tabwriter.Writer) { printPlan(w, pv, now) })
	if err != nil {
		return err
	}
	switch {
	case len(pv.Records) == 0:
		return exitError{exitNotFound, fmt.Sprintf("no record to %s matches", c.action)}
	case !c.yes && len(targets) > 0:
		return exitError{exitRefused, fmt.Sprintf("nothing changed: run again with --yes (-y) and --reason to %s %s", c.action, plural(len(targets), "record"))}
	case len(pv.Refused) > 0:
		return exitError{exitRefused, fmt.Sprintf("%s refused; see above", plural(len(pv.Refused), "record"))}
	}
	return nil
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

func printPlan(w *tabwriter.Writer, pv planView, now time.Time) {
	verb := map[bool]string{true: "would " + pv.Action, false: pastTense(pv.Action)}[pv.DryRun]
	if len(pv.Refused) == len(pv.Records) {
		verb = "will not " + pv.Action
	}
	refused := map[string]string{}
	for _, r := range pv.Refused {
		refused[r.Tenant+"\x00"+r.Operation+"\x00"+r.Key] = r.Reason
	}
	for _, v := range pv.Records {
		fmt.Fprintf(w, "%s the %s record of key %q in %s/%s\n", verb, v.State, v.Key, v.Tenant, v.Operation)
		fmt.Fprintf(w, "  state\t%s\n", v.stateText(now))
		if v.State == string(ledger.StatePending) {
			fmt.Fprintf(w, "  owner\t%s\n", v.OwnerToken)
		}
		fmt.Fprintf(w, "  attempts\t%d\n  created\t%s (%s)\n", v.Attempts, rfc3339(v.CreatedAt), ago(v.CreatedAt, now))
		if why, ok := refused[v.Tenant+"\x00"+v.Operation+"\x00"+v.Key]; ok {
			fmt.Fprintf(w, "  refused: %s\n", why)
		}
	}
	if pv.More {
		fmt.Fprintf(w, "more records match than --limit: those are left for another run\n")
	}
	if len(pv.Records) > 0 && len(pv.Refused) < len(pv.Records) {
		if pv.Action == string(ledger.ActionRelease) {
			fmt.Fprintf(w, "after a release the next attempt claims the key afresh and makes its external call again, with the same downstream key\n")
		} else {
			fmt.Fprintf(w, "after an eviction the next request with the key runs again instead of replaying\n")
		}
	}
	for _, d := range pv.Done {
		fmt.Fprintf(w, "audit row %d: %s by %s: %q\n", d.ID, pastTense(d.Action), d.Actor, d.Reason)
	}
}

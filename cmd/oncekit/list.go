package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/shard"
)

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
	fs.StringVar(&f.id.workflowID, "workflow-id", "", "only records this workflow's activities and sagas wrote (older records: keys that hold the workflow ID)")
	fs.StringVar(&f.id.runID, "run-id", "", "only records this workflow run's activities and sagas wrote (older records: keys that hold the run ID)")
	fs.StringVar(&f.id.activityType, "activity-type", "", "only records activities of this type wrote, such as payments.Charge")
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
	if o.Origin, o.KeyPatterns, err = f.id.origin(); err != nil {
		return o, err
	}
	if f.after != "" {
		if o.After, err = decodeCursor(f.after); err != nil {
			return o, err
		}
	}
	return o, nil
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
		Use: "list",
		Example: `  oncekit list --stuck
  oncekit list --workflow-id order-1
  oncekit list --run-id 0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44 --activity-type payments.Charge
  oncekit list --tenant shop --operation payments.charge --since 2h
  oncekit list --key-prefix order- --limit 20 --json`,
		Short: "List records, newest first, found by tenant, operation, state, time, key or Temporal IDs",
		Long: `list shows records newest first. Filters combine. Records written by activities and sagas
on a worker with oncekit's plugin carry their workflow ID, run ID and activity type, so
--workflow-id, --run-id and --activity-type find them whatever their keys are made of;
records written before the ledger's migration 004 are found by their keys, which hold
Temporal IDs (run ID and activity ID by default, workflow ID and activity ID when
workflow-scoped; a saga's default key holds its workflow ID and original run ID), and
--activity-id looks in keys alone. When more records match
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
	// Hint says what a lookup by workflow ID cannot find, and how to find it.
	Hint string `json:"hint,omitempty"`
}

// workflowHint says, for a lookup by --workflow-id alone that found nothing, where
// records written before the ledger's migration 004 (which carry no workflow ID) are;
// "" for any other lookup.
func workflowHint(id identity, recs []ledger.Record) string {
	if id.workflowID == "" || id.runID != "" || id.activityID != "" || len(recs) > 0 {
		return ""
	}
	return fmt.Sprintf("records written before the ledger's migration 004 carry no workflow ID, and default activity keys hold the run ID, not the workflow ID: find the workflow's runs (temporal workflow list -q 'WorkflowId=%q') and use --run-id", id.workflowID)
}

// sagaKey reads a saga's default key (keys.Business("saga", workflow ID, run ID)).
func sagaKey(k keys.Key) (workflowID, runID string, ok bool) {
	rest, ok := strings.CutPrefix(string(k), "v1:biz:saga:")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 2 {
		return "", "", false
	}
	return unescapePart(parts[0]), unescapePart(parts[1]), true
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
	recs, listErr := l.List(a.ctx, &o)
	var down *shard.Error
	if listErr != nil && !errors.As(listErr, &down) {
		return listErr
	}
	// Shards that failed are named after the records of those that answered.
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
	lv.Hint = workflowHint(f.id, recs)
	err = a.emit(lv, func(w *tabwriter.Writer) {
		fmt.Fprintln(w, "TENANT\tOPERATION\tKEY\tSTATE\tATTEMPTS\tCREATED\tWORKFLOW\tACTIVITY TYPE")
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
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", v.Tenant, v.Operation, v.Key, state, v.Attempts, rfc3339(v.CreatedAt),
				orDash(v.WorkflowID), orDash(v.ActivityType))
		}
	})
	if err == nil && lv.More && !a.json {
		fmt.Fprintf(a.errOut, "oncekit: more records match: add --after %s for the next page\n", *lv.NextCursor)
	}
	if err == nil && lv.Hint != "" && !a.json {
		fmt.Fprintf(a.errOut, "oncekit: note: %s\n", lv.Hint)
	}
	if err == nil {
		err = listErr
	}
	return err
}

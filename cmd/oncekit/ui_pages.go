package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// The console's pages. Each reads what it shows with the calls the commands make, and
// each action is the command's: a dry run first, then the change with a reason, kept in
// the same audit rows.

// panelLimit bounds each panel of the home page.
const panelLimit = 20

// uiPageLimit is how many records a page of search results shows by default.
const uiPageLimit = 50

// now is the database's clock on s.
func (s *uiShard) now(ctx context.Context) time.Time {
	var now time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Now()
	}
	return now
}

// link is a page's address with its query, keeping the shard.
func link(path string, d *pageData, q url.Values) string {
	if q == nil {
		q = url.Values{}
	}
	if d.Shard != "" {
		q.Set("shard", d.Shard)
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

func recordLink(d *pageData, tenant, operation, key string) string {
	return link("/record", d, url.Values{"tenant": {tenant}, "operation": {operation}, "key": {key}})
}

// row is a record in a table, with its page's address.
type row struct {
	recordView
	Link  string
	State string
}

func rows(d *pageData, recs []ledger.Record) []row {
	out := []row{}
	for _, r := range recs {
		v := view(r, false)
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
		if v.Uncertain {
			state += " (uncertain)"
		}
		out = append(out, row{recordView: v, Link: recordLink(d, v.Tenant, v.Operation, v.Key), State: state})
	}
	return out
}

// homePage is the home page's panels.
type homePage struct {
	Stuck, Uncertain []row
	UncertainCount   int64
	// CountsAbout is set when the counts were reused from CountedAt (a large table).
	CountsAbout  bool
	CountedAt    time.Time
	Dead         []eventView
	Backlog      []topicBacklog
	Inbox        []subscriberView
	Stats        ledger.Stats
	Outbox       outbox.Stats
	StuckLink    string
	ReleaseStuck string
}

// topicBacklog is the outbox's pending and dead events of a topic.
type topicBacklog struct {
	Topic         string
	Pending, Dead int64
	OldestPending time.Time
	RetryLink     string
}

func (c *console) home(r *http.Request, s *uiShard, d *pageData) (string, error) {
	ctx := r.Context()
	d.Title = "Overview"
	var p homePage
	var err error
	n, err := c.counts(ctx, s)
	if err != nil {
		return "", err
	}
	p.Stats, p.UncertainCount, p.CountsAbout, p.CountedAt = n.Stats, n.Uncertain, n.About, n.At
	stuck, err := s.ledger.List(ctx, &ledger.ListOpts{Stuck: true, Limit: panelLimit})
	if err != nil {
		return "", err
	}
	p.Stuck = rows(d, stuck)
	p.StuckLink = link("/records", d, url.Values{"stuck": {"1"}})
	p.ReleaseStuck = link("/change", d, url.Values{"action": {"release"}, "stuck": {"1"}})
	uncertain, err := c.uncertain(ctx, s)
	if err != nil {
		return "", err
	}
	p.Uncertain = rows(d, uncertain)
	if p.Outbox, err = s.outbox.Stats(ctx); err != nil {
		return "", err
	}
	dead, err := s.outbox.ListDead(ctx, &outbox.DeadOpts{Limit: panelLimit})
	if err != nil {
		return "", err
	}
	p.Dead = deadViews(dead)
	if p.Backlog, err = c.backlog(ctx, s, d); err != nil {
		return "", err
	}
	st, err := s.inbox.Stats(ctx)
	if err != nil {
		return "", err
	}
	p.Inbox = subscribers(st)
	d.P = p
	return "home", nil
}

// uncertain returns the newest records whose attempt may or may not have reached its
// provider.
func (c *console) uncertain(ctx context.Context, s *uiShard) ([]ledger.Record, error) {
	table := pgx.Identifier{c.a.schema, "idempotency_records"}.Sanitize()
	rs, err := s.pool.Query(ctx, "SELECT tenant, operation, key FROM "+table+" WHERE uncertain ORDER BY updated_at DESC LIMIT $1", panelLimit)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) ([3]string, error) {
		var id [3]string
		return id, row.Scan(&id[0], &id[1], &id[2])
	})
	if err != nil {
		return nil, err
	}
	var recs []ledger.Record
	for _, id := range ids {
		r, err := s.ledger.Get(ctx, keys.Scope{Tenant: id[0], Operation: id[1]}, keys.Key(id[2]))
		if errors.Is(err, ledger.ErrNotFound) {
			continue // changed since
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, *r)
	}
	return recs, nil
}

// backlog counts the outbox's pending and dead events by topic.
func (c *console) backlog(ctx context.Context, s *uiShard, d *pageData) ([]topicBacklog, error) {
	rs, err := s.pool.Query(ctx, `SELECT topic, count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'dead'),
		coalesce(min(created_at) FILTER (WHERE state = 'pending'), 'epoch')
		FROM `+pgx.Identifier{c.a.schema, "outbox_events"}.Sanitize()+` WHERE state IN ('pending', 'dead') GROUP BY topic ORDER BY topic LIMIT 200`)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (topicBacklog, error) {
		var b topicBacklog
		err := row.Scan(&b.Topic, &b.Pending, &b.Dead, &b.OldestPending)
		if b.OldestPending.Unix() == 0 {
			b.OldestPending = time.Time{}
		}
		if b.Dead > 0 {
			b.RetryLink = link("/outbox/retry", d, url.Values{"topic": {b.Topic}})
		}
		return b, err
	})
	return out, err
}

// searchForm is the search's fields, as the form gives them back.
type searchForm struct {
	Tenant, Operation, State, Key, KeyPrefix string
	WorkflowID, RunID, ActivityID            string
	ActivityType                             string
	Since, Until                             string
	Stuck                                    bool
	Limit                                    int
}

// formFilters reads the search's fields into the filters list uses.
func formFilters(r *http.Request) (searchForm, filters, error) {
	sf := searchForm{Tenant: r.FormValue("tenant"), Operation: r.FormValue("operation"), State: r.FormValue("state"),
		Key: r.FormValue("key"), KeyPrefix: r.FormValue("key_prefix"), WorkflowID: r.FormValue("workflow_id"),
		RunID: r.FormValue("run_id"), ActivityID: r.FormValue("activity_id"), ActivityType: r.FormValue("activity_type"), Since: r.FormValue("since"),
		Until: r.FormValue("until"), Stuck: r.FormValue("stuck") == "1", Limit: uiPageLimit}
	if l := r.FormValue("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n <= 0 || n > maxListLimit {
			return sf, filters{}, usageError{fmt.Sprintf("limit: give 1 to %d", maxListLimit)}
		}
		sf.Limit = n
	}
	f := filters{state: sf.State, tenant: sf.Tenant, operation: sf.Operation, since: sf.Since, until: sf.Until,
		keyPrefix: sf.KeyPrefix, stuck: sf.Stuck, limit: sf.Limit, after: r.FormValue("after"),
		id: identity{workflowID: sf.WorkflowID, runID: sf.RunID, activityID: sf.ActivityID, activityType: sf.ActivityType}}
	return sf, f, nil
}

// listOpts turns the filters into ledger.ListOpts; an exact key is a LIKE pattern of
// itself, so it combines with the others.
func listOpts(sf searchForm, f filters, now time.Time) (ledger.ListOpts, error) {
	o, err := f.opts(now)
	if err != nil {
		return o, err
	}
	if sf.Key != "" {
		if len(o.KeyPatterns) > 0 || !o.Origin.IsZero() {
			return o, usageError{"a key, and workflow, run or activity IDs or an activity type, choose records each alone: give one of them"}
		}
		o.KeyPatterns = []string{likeEscape(sf.Key)}
	}
	return o, nil
}

// query is the search's fields as a query, for the next page's and the actions' links.
func (sf searchForm) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"tenant": sf.Tenant, "operation": sf.Operation, "state": sf.State, "key": sf.Key,
		"key_prefix": sf.KeyPrefix, "workflow_id": sf.WorkflowID, "run_id": sf.RunID, "activity_id": sf.ActivityID,
		"activity_type": sf.ActivityType, "since": sf.Since, "until": sf.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if sf.Stuck {
		q.Set("stuck", "1")
	}
	if sf.Limit != uiPageLimit {
		q.Set("limit", strconv.Itoa(sf.Limit))
	}
	return q
}

// recordsPage is a page of search results.
type recordsPage struct {
	Form                   searchForm
	States                 []string
	Searched               bool
	Rows                   []row
	Next                   string
	Hint                   string
	ReleaseLink, EvictLink string
}

func (c *console) records(r *http.Request, s *uiShard, d *pageData) (string, error) {
	d.Title = "Records"
	sf, f, err := formFilters(r)
	p := recordsPage{Form: sf, States: []string{"", "pending", "completed", "failed"}, Searched: len(r.URL.Query()) > 0}
	d.P = &p
	if err != nil {
		d.Error = err.Error()
		return "records", nil
	}
	o, err := listOpts(sf, f, s.now(r.Context()))
	if err != nil {
		d.Error = err.Error()
		return "records", nil
	}
	o.Limit++
	recs, err := s.ledger.List(r.Context(), &o)
	if err != nil {
		return "", err
	}
	if len(recs) > sf.Limit {
		recs = recs[:sf.Limit]
		q := sf.query()
		q.Set("after", encodeCursor(recs[len(recs)-1]))
		p.Next = link("/records", d, q)
	}
	p.Rows = rows(d, recs)
	p.Hint = workflowHint(f.id, recs)
	if f.any() || sf.Key != "" {
		q := sf.query()
		q.Set("action", "release")
		p.ReleaseLink = link("/change", d, q)
		q = sf.query()
		q.Set("action", "evict")
		p.EvictLink = link("/change", d, q)
	}
	return "records", nil
}

// recordPage is a record's page.
type recordPage struct {
	Tenant, Operation, Key string
	Record                 *recordView
	StateText              string
	Revealed               bool
	Audit                  []auditView
	DownstreamKey          string
	TemporalLink           string
	ActionLink             string
	ActionName             string
	// Saga is set on a saga's record: how it ended, as its record says.
	Saga string
	// Run lists the other records the same workflow run wrote: a saga's steps and
	// compensations on its page, and the saga beside a step's; RunMore is set when there
	// are more than shown, RunLink searches them all.
	Run     []row
	RunMore bool
	RunLink string
}

// sagaOperation is the operation sagas record their outcome under (saga.Operation; the
// command does not import package saga, which would bring Temporal's SDK into it).
const sagaOperation = "oncekit.saga"

// sagaOutcome says how a saga ended, from its record's state: never from its body,
// which stays hidden until revealed.
func sagaOutcome(r *ledger.Record) string {
	switch r.State {
	case ledger.StateCompleted:
		return "completed: its result is the stored body"
	case ledger.StateFailed:
		return "ended with " + r.ErrorCode + ": " + r.ErrorMessage
	}
	if r.LeaseExpired {
		return "running, but its run stopped renewing its claim: the next run of the workflow takes it over"
	}
	return "running: a run holds it"
}

func (c *console) record(r *http.Request, s *uiShard, d *pageData) (string, error) {
	return c.showRecord(r, s, d, false)
}

// reveal shows the record with its stored body, to an operator.
func (c *console) reveal(r *http.Request, s *uiShard, d *pageData) (string, error) {
	// The log names who revealed which record's body, never the body.
	c.log.Printf("reveal: user=%s tenant=%q operation=%q key=%q", d.User.Name, clip(r.PostForm.Get("tenant"), 100),
		clip(r.PostForm.Get("operation"), 100), clip(r.PostForm.Get("key"), 200))
	return c.showRecord(r, s, d, true)
}

func (c *console) showRecord(r *http.Request, s *uiShard, d *pageData, reveal bool) (string, error) {
	ctx := r.Context()
	scope := keys.Scope{Tenant: r.FormValue("tenant"), Operation: r.FormValue("operation")}
	key := keys.Key(r.FormValue("key"))
	if err := validRecordID(scope, key); err != nil {
		return "", err
	}
	d.Title = "Record " + clip(string(key), 60)
	p := recordPage{Tenant: scope.Tenant, Operation: scope.Operation, Key: string(key), Audit: []auditView{}, Revealed: reveal}
	entries, err := s.ledger.Audit(ctx, scope, key)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		p.Audit = append(p.Audit, auditOf(e))
	}
	rec, err := s.ledger.Get(ctx, scope, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		if len(p.Audit) == 0 {
			return "", notFound(scope, key)
		}
	case err != nil:
		return "", err
	default:
		v := view(*rec, reveal)
		p.Record = &v
		p.StateText = v.stateText(s.now(ctx))
		if externalCall(key) {
			if dk, err := keys.DeriveIn(scope, key, purposeDefault); err == nil {
				p.DownstreamKey = string(dk)
			}
		}
		p.TemporalLink = c.temporalLink(key, rec.Origin)
		if scope.Operation == sagaOperation {
			p.Saga = sagaOutcome(rec)
		}
		if run := rec.Origin.RunID; run != "" {
			same, err := s.ledger.List(ctx, &ledger.ListOpts{Tenant: scope.Tenant, Origin: ledger.Origin{RunID: run}, Limit: panelLimit + 2})
			if err != nil {
				return "", err
			}
			others := make([]ledger.Record, 0, len(same))
			for _, o := range same {
				if o.Scope != scope || o.Key != key {
					others = append(others, o)
				}
			}
			if len(others) > panelLimit {
				others, p.RunMore = others[:panelLimit], true
			}
			p.Run = rows(d, others)
			p.RunLink = link("/records", d, url.Values{"tenant": {scope.Tenant}, "run_id": {run}})
		}
		action := ledger.ActionEvict
		if rec.State == ledger.StatePending {
			action = ledger.ActionRelease
		}
		p.ActionName = string(action)
		p.ActionLink = link("/change", d, url.Values{"action": {string(action)}, "target": {"one"},
			"tenant": {scope.Tenant}, "operation": {scope.Operation}, "key": {string(key)}})
	}
	d.P = p
	return "record", nil
}

// externalCall says whether a record of key is an activity's, which activity.External
// derives a downstream key from; other records made no call with one.
func externalCall(key keys.Key) bool {
	for _, kind := range []string{"run", "local", "wf", "lwf", "sa"} {
		if strings.HasPrefix(string(key), "v1:"+kind+":") {
			return true
		}
	}
	return false
}

// temporalLink is the address in Temporal's Web UI of the workflow run that wrote a
// record: its origin's, or the one its key names (a search by run ID when the key holds
// only that).
func (c *console) temporalLink(key keys.Key, o ledger.Origin) string {
	if c.temporalUI == "" {
		return ""
	}
	base := c.temporalUI + "/namespaces/" + url.PathEscape(c.ns) + "/workflows"
	if o.WorkflowID != "" && o.RunID != "" {
		return base + "/" + url.PathEscape(o.WorkflowID) + "/" + url.PathEscape(o.RunID) + "/history"
	}
	if wf, run, ok := sagaKey(key); ok {
		return base + "/" + url.PathEscape(wf) + "/" + url.PathEscape(run) + "/history"
	}
	parts := strings.Split(string(key), ":")
	if len(parts) != 4 || strings.Contains(string(key), "~") {
		return ""
	}
	id := unescapePart(parts[2])
	switch parts[1] {
	case "run", "local":
		return base + "?query=" + url.QueryEscape(fmt.Sprintf("RunId=%q", id))
	case "wf", "lwf":
		return base + "?query=" + url.QueryEscape(fmt.Sprintf("WorkflowId=%q", id))
	}
	return ""
}

// hidden is a form's hidden field.
type hidden struct{ Name, Value string }

// changePage is a release's or an eviction's dry run, or what it changed.
type changePage struct {
	Action    string
	One       bool
	Plan      planView
	Targets   int
	Hidden    []hidden
	Force     bool
	ForceLink string
	Done      bool
	Now       time.Time
	Reason    string
}

// chooseForChange reads the change the form asks for and the records it chooses.
func (c *console) chooseForChange(r *http.Request, s *uiShard, d *pageData) (change, []ledger.Record, bool, *changePage, error) {
	ctx := r.Context()
	act := ledger.Action(r.FormValue("action"))
	if act != ledger.ActionRelease && act != ledger.ActionEvict {
		return change{}, nil, false, nil, usageError{"action: release or evict"}
	}
	ch := change{action: act, force: r.FormValue("force") == "1"}
	p := &changePage{Action: string(act), One: r.FormValue("target") == "one", Force: ch.force}
	keep := []string{"action", "target", "force", "tenant", "operation", "state", "key", "key_prefix", "workflow_id", "run_id",
		"activity_id", "since", "until", "stuck", "limit"}
	q := url.Values{}
	for _, k := range keep {
		if v := r.FormValue(k); v != "" {
			p.Hidden = append(p.Hidden, hidden{k, v})
			q.Set(k, v)
		}
	}
	if act == ledger.ActionRelease && !ch.force {
		q.Set("force", "1")
		p.ForceLink = link("/change", d, q)
	}
	if p.One {
		scope := keys.Scope{Tenant: r.FormValue("tenant"), Operation: r.FormValue("operation")}
		key := keys.Key(r.FormValue("key"))
		if err := validRecordID(scope, key); err != nil {
			return ch, nil, false, p, err
		}
		rec, err := s.ledger.Get(ctx, scope, key)
		if errors.Is(err, ledger.ErrNotFound) {
			return ch, nil, false, p, notFound(scope, key)
		}
		if err != nil {
			return ch, nil, false, p, err
		}
		if (rec.State == ledger.StatePending) != (act == ledger.ActionRelease) {
			return ch, nil, false, p, exitError{exitWrongState, strings.TrimPrefix((&ledger.WrongStateError{Scope: scope, Key: key, Action: act, State: rec.State}).Error(), "oncekit/ledger: ")}
		}
		return ch, []ledger.Record{*rec}, false, p, nil
	}
	sf, f, err := formFilters(r)
	if err != nil {
		return ch, nil, false, p, err
	}
	if !f.any() && sf.Key == "" {
		return ch, nil, false, p, usageError{fmt.Sprintf("a %s by filter needs filters that choose records (tenant, operation, state, time, key, IDs)", act)}
	}
	f.after = ""
	o, err := listOpts(sf, f, s.now(ctx))
	if err != nil {
		return ch, nil, false, p, err
	}
	recs, more, err := chooseMany(ctx, s.ledger, ch, o, sf.Limit)
	return ch, recs, more, p, err
}

func (c *console) changePreview(r *http.Request, s *uiShard, d *pageData) (string, error) {
	ch, recs, more, p, err := c.chooseForChange(r, s, d)
	if err != nil {
		return "", err
	}
	d.Title = "Preview: " + string(ch.action)
	p.Now = s.now(r.Context())
	p.Plan, _, err = plan(r.Context(), s.ledger, ch, recs, more, p.Now)
	if err != nil {
		return "", err
	}
	p.Targets = len(p.Plan.Records) - len(p.Plan.Refused)
	uiWording(&p.Plan)
	d.P = p
	return "change", nil
}

// uiWording words the refusals for the console, where force is a link, not a flag.
func uiWording(pv *planView) {
	for i := range pv.Refused {
		pv.Refused[i].Reason = strings.ReplaceAll(pv.Refused[i].Reason, "add --force", "preview with force")
	}
}

// actorOf names the console's user in audit rows.
func actorOf(u uiUser) string {
	return clip(u.Name, ledger.MaxActorLen-len(" (oncekit ui)")) + " (oncekit ui)"
}

func (c *console) changeDo(r *http.Request, s *uiShard, d *pageData) (string, error) {
	ch, recs, more, p, err := c.chooseForChange(r, s, d)
	if err != nil {
		return "", err
	}
	ch.reason = strings.TrimSpace(r.PostForm.Get("reason"))
	ch.actor = actorOf(d.User)
	p.Now = s.now(r.Context())
	d.Title = "Preview: " + string(ch.action)
	if ch.reason == "" || len(ch.reason) > ledger.MaxReasonLen {
		d.Error = fmt.Sprintf("a %s needs a reason of 1 to %d bytes, such as the incident's reference: it is kept in the audit row", ch.action, ledger.MaxReasonLen)
		p.Plan, _, err = plan(r.Context(), s.ledger, ch, recs, more, p.Now)
		p.Targets = len(p.Plan.Records) - len(p.Plan.Refused)
		d.P = p
		return "change", err
	}
	ch.yes = true
	p.Plan, _, err = plan(r.Context(), s.ledger, ch, recs, more, p.Now)
	if err != nil {
		return "", err
	}
	uiWording(&p.Plan)
	p.Done, p.Reason = true, ch.reason
	c.log.Printf("%s: user=%s records=%d refused=%d", ch.action, d.User.Name, len(p.Plan.Done), len(p.Plan.Refused))
	d.Title = pastTense(string(ch.action))
	d.P = p
	return "change", nil
}

// retryPage is an outbox retry's dry run, or what it retried.
type retryPage struct {
	Dead    []eventView
	Hidden  []hidden
	Done    bool
	Retried []string
	Reason  string
	What    string
}

// retryOpts reads the retry the form asks for: an event's ID, a topic, or all.
func retryOpts(r *http.Request) (*outbox.RetryDeadOpts, []hidden, string, error) {
	opts := &outbox.RetryDeadOpts{Topic: r.FormValue("topic"), All: r.FormValue("all") == "1"}
	var hs []hidden
	what := ""
	if id := r.FormValue("id"); id != "" {
		u, err := parseEventID(id)
		if err != nil {
			return nil, nil, "", err
		}
		opts.IDs = []uuid.UUID{u}
		hs, what = append(hs, hidden{"id", id}), "event "+u.String()
	}
	if opts.Topic != "" {
		hs, what = append(hs, hidden{"topic", opts.Topic}), "the dead events of topic "+opts.Topic
	}
	if opts.All {
		hs, what = append(hs, hidden{"all", "1"}), "every dead event"
	}
	if len(hs) != 1 {
		return nil, nil, "", usageError{"a retry takes an event's ID, or a topic, or all: one of them"}
	}
	return opts, hs, what, nil
}

func (c *console) retryPreview(r *http.Request, s *uiShard, d *pageData) (string, error) {
	opts, hs, what, err := retryOpts(r)
	if err != nil {
		return "", err
	}
	d.Title = "Preview: outbox retry"
	var dead []outbox.DeadEvent
	if len(opts.IDs) > 0 {
		dead, err = (&app{ctx: r.Context()}).deadByID(s.outbox, opts.IDs)
	} else {
		dead, err = s.outbox.ListDead(r.Context(), &outbox.DeadOpts{Topic: opts.Topic, Limit: outbox.MaxRetryDead + 1})
		if err == nil && len(dead) > outbox.MaxRetryDead {
			err = exitError{exitRefused, fmt.Sprintf("more than %d dead events match, more than one retry takes: retry them by topic or by ID, in parts", outbox.MaxRetryDead)}
		}
	}
	if err != nil {
		return "", err
	}
	d.P = retryPage{Dead: deadViews(dead), Hidden: hs, What: what}
	return "retry", nil
}

func (c *console) retryDo(r *http.Request, s *uiShard, d *pageData) (string, error) {
	opts, hs, what, err := retryOpts(r)
	if err != nil {
		return "", err
	}
	opts.Reason, opts.Actor = strings.TrimSpace(r.PostForm.Get("reason")), actorOf(d.User)
	if opts.Reason == "" || len(opts.Reason) > ledger.MaxReasonLen {
		msg := fmt.Sprintf("a retry needs a reason of 1 to %d bytes, such as the incident's reference: it is kept in the audit rows", ledger.MaxReasonLen)
		name, err := c.retryPreview(r, s, d)
		d.Error = msg
		return name, err
	}
	ids, err := s.outbox.RetryDead(r.Context(), opts)
	var nd *outbox.NotDeadError
	if errors.As(err, &nd) {
		return "", notDeadExit(nd)
	}
	if err != nil {
		return "", err
	}
	p := retryPage{Hidden: hs, Done: true, Reason: opts.Reason, What: what, Retried: []string{}}
	for _, id := range ids {
		p.Retried = append(p.Retried, id.String())
	}
	c.log.Printf("outbox retry: user=%s events=%d", d.User.Name, len(ids))
	d.Title = "Retried"
	d.P = p
	return "retry", nil
}

// purgePage is a purge's count, or what it deleted.
type purgePage struct {
	View   purgeView
	Total  int64
	Done   bool
	Reason string
}

func (c *console) purgeSteps(r *http.Request, s *uiShard) []purgeStep {
	ra := &app{ctx: r.Context(), schema: c.a.schema}
	p := purgeFlags{batch: ledger.PurgeBatchDefault, pause: ledger.PurgePauseDefault, retention: outbox.PublishedRetentionDefault}
	return []purgeStep{ra.ledgerPurge(s.ledger, p), inboxPurge(ra, s.inbox, p), outboxPurge(ra, s.outbox, p)}
}

func (c *console) runPurge(r *http.Request, s *uiShard, d *pageData, do bool) (string, error) {
	p := purgePage{View: purgeView{DryRun: !do, Tables: []purgeTable{}}, Done: do}
	for _, st := range c.purgeSteps(r, s) {
		t := purgeTable{Table: c.a.schema + "." + st.table, What: st.what}
		var err error
		if do {
			t.Count, t.Batches, err = st.purge()
		} else {
			t.Count, err = st.count()
		}
		if err != nil {
			return "", err
		}
		p.Total += t.Count
		p.View.Tables = append(p.View.Tables, t)
	}
	d.P = p
	return "purge", nil
}

func (c *console) purgePreview(r *http.Request, s *uiShard, d *pageData) (string, error) {
	d.Title = "Preview: purge"
	return c.runPurge(r, s, d, false)
}

func (c *console) purgeDo(r *http.Request, s *uiShard, d *pageData) (string, error) {
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" || len(reason) > ledger.MaxReasonLen {
		d.Title = "Preview: purge"
		d.Error = fmt.Sprintf("a purge needs a reason of 1 to %d bytes", ledger.MaxReasonLen)
		return c.runPurge(r, s, d, false)
	}
	d.Title = "Purged"
	name, err := c.runPurge(r, s, d, true)
	if err == nil {
		p := d.P.(purgePage)
		p.Reason = reason
		d.P = p
		// A purge deletes what outlived its retention and keeps no audit row: the log
		// says who purged, how much, and why.
		c.log.Printf("purge: user=%s deleted=%d reason=%q", d.User.Name, p.Total, clip(reason, 200))
	}
	return name, err
}

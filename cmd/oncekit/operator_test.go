package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// deadEvents enqueues one event per topic and lets a publisher that refuses them all
// kill them.
func (b *bundle) deadEvents(t *testing.T, topics ...string) (*outbox.Outbox, []uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	var ids []uuid.UUID
	for _, topic := range topics {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			got, err := out.Enqueue(ctx, tx, outbox.Event{Topic: topic, Payload: []byte(`{}`)})
			ids = append(ids, got...)
			return err
		}))
	}
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		return outbox.ErrPermanent
	}), nil)
	require.NoError(t, err)
	_, err = d.Drain(ctx)
	require.NoError(t, err)
	return out, ids
}

// outbox retry needs a reason, keeps an audit row naming the operator, and tells an
// event no outbox holds (exit 3) from one that is not dead (exit 6).
func TestOutboxRetry_ReasonAuditAndMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, ids := b.deadEvents(t, "payments.captured", "payments.captured")
	dead1, dead2 := ids[0], ids[1]
	absent := uuid.New()

	r := b.run(t, "outbox", "retry", dead1.String())
	require.Equal(t, exitUsage, r.code, r.errOut)
	require.Contains(t, r.errOut, "--reason")
	e, err := out.Get(context.Background(), dead1)
	require.NoError(t, err)
	require.Equal(t, outbox.StateDead, e.State, "nothing retried without a reason")

	r = b.run(t, "outbox", "retry", absent.String(), "--reason", "INC-1")
	require.Equal(t, exitNotFound, r.code, r.errOut)
	require.Contains(t, r.errOut, "no such event: "+absent.String())
	require.NotContains(t, r.errOut, "not dead")

	r = b.run(t, "outbox", "retry", dead1.String(), "--reason", "INC-313: broker schema fixed", "--actor", "alice")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "retrying  "+dead1.String())
	r = b.run(t, "outbox", "retry", dead1.String(), absent.String(), "--reason", "INC-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	require.Contains(t, r.errOut, "1 event is not dead: "+dead1.String())
	require.Contains(t, r.errOut, "no such event: "+absent.String())

	// --topic without --yes plans, and names only what is missing to act.
	r = b.run(t, "outbox", "retry", "--topic", "payments.captured", "--reason", "INC-2")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.Contains(t, r.errOut, "run again with --yes (-y) to retry 1 event")
	r = b.run(t, "outbox", "retry", "--topic", "payments.captured")
	require.Contains(t, r.errOut, "run again with --yes (-y) and --reason to retry 1 event")
	r = b.run(t, "outbox", "retry", "--topic", "payments.captured", "-y")
	require.Equal(t, exitUsage, r.code, "--yes needs --reason")
	var rv retryView
	r = b.runJSON(t, &rv, "outbox", "retry", dead2.String(), "--dry-run")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []string{dead2.String()}, rv.WouldRetry)
	require.Empty(t, rv.Retried)

	entries, err := out.ListAudit(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, entries, 1, "one retry made")
	require.Equal(t, dead1, entries[0].EventID)
	require.Equal(t, "alice", entries[0].Actor)
	require.Equal(t, "INC-313: broker schema fixed", entries[0].Reason)
}

// audit lists releases, evictions and outbox retries newest first, with filters, as
// text and as JSON.
func TestAudit_ListsChangesWithFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stuck(t, "shop", "payments.charge", "c-1")
	b.complete(t, "shop", "orders.create", "o-1", `{"secret":1}`)
	b.complete(t, "globex", "orders.create", "o-1", `{}`)
	_, ids := b.deadEvents(t, "payments.captured")

	require.Equal(t, exitOK, b.run(t, "release", "shop", "payments.charge", "c-1", "-y", "--reason", "INC-1: host gone", "--actor", "alice").code)
	require.Equal(t, exitOK, b.run(t, "evict", "shop", "orders.create", "o-1", "-y", "--reason", "INC-2: wrong price", "--actor", "bob").code)
	require.Equal(t, exitOK, b.run(t, "evict", "globex", "orders.create", "o-1", "-y", "--reason", "INC-3", "--actor", "alice").code)
	require.Equal(t, exitOK, b.run(t, "outbox", "retry", ids[0].String(), "--reason", "INC-4: broker fixed", "--actor", "carol").code)

	list := func(args ...string) []auditRow {
		t.Helper()
		var lv auditListView
		r := b.runJSON(t, &lv, append([]string{"audit"}, args...)...)
		require.Equal(t, exitOK, r.code, r.errOut)
		return lv.Rows
	}
	rows := list()
	require.Len(t, rows, 4)
	require.Equal(t, "retry", rows[0].Action, "newest first")
	require.Equal(t, ids[0].String(), rows[0].EventID)
	require.Equal(t, "payments.captured", rows[0].Topic)
	require.Equal(t, "carol", rows[0].Actor)
	require.Equal(t, "release", rows[3].Action)
	require.Equal(t, "pending", rows[3].Before.State)
	require.NotContains(t, b.run(t, "audit", "--json").out, "secret", "no stored body in the audit")

	actions := func(rows []auditRow) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Action+":"+r.Tenant+r.Topic)
		}
		return out
	}
	require.Equal(t, []string{"evict:globex", "release:shop"}, actions(list("--actor", "alice")))
	require.Equal(t, []string{"evict:shop", "release:shop"}, actions(list("--tenant", "shop")))
	require.Equal(t, []string{"evict:globex", "evict:shop"}, actions(list("--operation", "orders.create")))
	require.Equal(t, []string{"evict:globex", "evict:shop"}, actions(list("--key", "o-1")))
	require.Equal(t, []string{"retry:payments.captured"}, actions(list("--topic", "payments.captured")))
	require.Equal(t, []string{"retry:payments.captured"}, actions(list("--action", "retry")))
	require.Equal(t, []string{"release:shop"}, actions(list("--action", "release")))
	require.Len(t, list("--since", "1h"), 4)
	require.Empty(t, list("--until", "1h"))
	require.Len(t, list("--limit", "2"), 2)

	r := b.run(t, "audit", "--tenant", "shop")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "AT")
	require.Contains(t, r.out, `"INC-1: host gone"`)
	require.Contains(t, r.out, "shop/payments.charge c-1, pending")
	r = b.run(t, "audit", "--limit", "1")
	require.Contains(t, r.errOut, "more rows match")
	require.Equal(t, exitUsage, b.run(t, "audit", "--tenant", "shop", "--topic", "x").code)
	require.Equal(t, exitUsage, b.run(t, "audit", "--action", "purge").code)
	require.Equal(t, exitUsage, b.run(t, "audit", "--event-id", "nope").code)
}

// inbox show finds a message's record by subscriber and message ID, and says what no
// record means.
func TestInboxShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	in, err := inbox.New(b.pool, &inbox.Config{Schema: b.schema})
	require.NoError(t, err)
	_, err = in.Handle(ctx, "billing", "msg-1", func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)
	_, err = in.Handle(ctx, "billing", "msg-2", func(context.Context, pgx.Tx) error {
		return ledger.Definitive("bad_payload", "amount is not a number")
	})
	require.Error(t, err)

	r := b.run(t, "inbox", "show", "billing", "msg-1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "processed: a redelivery is a duplicate")
	var mv messageView
	r = b.runJSON(t, &mv, "inbox", "show", "billing", "msg-2")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, "rejected", mv.State)
	require.Contains(t, mv.Error, "amount is not a number")
	require.False(t, mv.Expired)

	r = b.run(t, "inbox", "show", "billing", "msg-3")
	require.Equal(t, exitNotFound, r.code, r.errOut)
	require.Contains(t, r.errOut, "its handler failed")
	require.Equal(t, exitUsage, b.run(t, "inbox", "show", "billing").code)
}

// --dry-run is accepted wherever --yes is, shows the same plan, changes nothing and
// exits 0; with --yes it is a usage error.
func TestDryRunFlag(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.stuck(t, "acme", "payments.charge", "c-1")
	_, err := b.pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+
		" SET expires_at = now() - interval '1 hour' WHERE key = 'o-1'")
	require.NoError(t, err)

	for _, args := range [][]string{{"purge"}, {"inbox", "purge"}, {"outbox", "purge"}} {
		r := b.run(t, append(args, "--dry-run")...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.errOut)
		require.Contains(t, r.out, "would purge", args)
		require.Equal(t, exitUsage, b.run(t, append(args, "--dry-run", "-y")...).code, args)
	}
	r := b.run(t, "purge")
	require.Equal(t, exitRefused, r.code, "without --dry-run a dry run still says how to act")
	var plan planView
	r = b.runJSON(t, &plan, "release", "acme", "payments.charge", "c-1", "--dry-run")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.True(t, plan.DryRun)
	require.Len(t, plan.Records, 1)
	r = b.run(t, "evict", "--tenant", "acme", "--dry-run")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "would evict")
	require.Equal(t, exitUsage, b.run(t, "release", "acme", "payments.charge", "c-1", "--dry-run", "-y", "--reason", "x").code)
	recs, err := b.ledger.List(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, recs, 2, "nothing changed")
}

// A release or eviction without --yes says only what it lacks to act.
func TestChange_MessageNamesOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stuck(t, "acme", "payments.charge", "c-1")
	r := b.run(t, "release", "acme", "payments.charge", "c-1", "--reason", "INC-1")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.Contains(t, r.errOut, "run again with --yes (-y) to release 1 record")
	require.NotContains(t, r.errOut, "--reason")
	r = b.run(t, "release", "acme", "payments.charge", "c-1", "--force", "--reason", "INC-1")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.NotContains(t, r.errOut, "--reason")
	r = b.run(t, "release", "acme", "payments.charge", "c-1")
	require.Contains(t, r.errOut, "run again with --yes (-y) and --reason to release 1 record")
}

// A release of a completed record and an eviction of a pending one exit 6, the wrong
// state, apart from 3, a record that does not exist.
func TestChange_WrongStateIsNotNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.stuck(t, "acme", "payments.charge", "c-1")
	r := b.run(t, "release", "acme", "orders.create", "o-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	require.Contains(t, r.errOut, "evict it instead")
	r = b.run(t, "evict", "acme", "payments.charge", "c-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	r = b.run(t, "release", "acme", "orders.create", "o-2")
	require.Equal(t, exitNotFound, r.code, r.errOut)
}

// migrate status exits 7 when migrations are pending, 0 when none is.
func TestMigrateStatus_PendingExitsSeven(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "migrate", "status")
	require.Equal(t, exitOK, r.code, r.errOut)
	_, err := b.pool.Exec(context.Background(), "DELETE FROM "+pgx.Identifier{b.schema, "oncekit_migrations"}.Sanitize()+
		" WHERE line = 'outbox' AND version = 5")
	require.NoError(t, err)
	r = b.run(t, "migrate", "status")
	require.Equal(t, exitPending, r.code, r.errOut)
	require.Regexp(t, `005_outbox_audit +pending`, r.out)
	require.Contains(t, r.errOut, "1 migration pending: run `oncekit migrate`")
	var raw map[string]json.RawMessage
	r = b.runJSON(t, &raw, "migrate", "status")
	require.Equal(t, exitPending, r.code)
	require.Equal(t, exitOK, b.run(t, "migrate").code)
	require.Equal(t, exitOK, b.run(t, "migrate", "status").code)
}

// Errors are one line; under --json they are a JSON object on stderr, usage errors
// included, with the exit code.
func TestErrors_OneLineAndJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{{"inspect", "acme"}, {"list", "--limit", "0"}, {"frobnicate"}, {"list", "--nope"},
		{"inspect", "a", "b", "c"}, {"outbox", "retry", uuid.NewString(), "--reason", "x"}} {
		r := b.run(t, args...)
		require.NotEqual(t, exitOK, r.code, args)
		require.Equal(t, 1, strings.Count(r.errOut, "\n"), "%v: %q", args, r.errOut)
		require.True(t, strings.HasPrefix(r.errOut, "oncekit: "), "%v: %q", args, r.errOut)

		r2 := b.run(t, append(args, "--json")...)
		require.Equal(t, r.code, r2.code, args)
		var je jsonError
		require.NoError(t, json.Unmarshal([]byte(r2.errOut), &je), "%v: stderr is not JSON: %q", args, r2.errOut)
		require.Equal(t, r.code, je.ExitCode, args)
		require.NotEmpty(t, je.Error, args)
		if r.code == exitUsage {
			require.Contains(t, je.Help, "--help", args)
		}
	}
}

// list --workflow-id that finds nothing says where records written before migration 004
// are; one that finds records says nothing more.
func TestList_WorkflowIDHint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "shop", "payments.charge", string(keys.Run("run-7", "5")), `{}`)
	r := b.run(t, "list", "--workflow-id", "order-1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.errOut, "default activity keys hold the run ID")
	require.Contains(t, r.errOut, "--run-id")

	sagaKey, err := keys.Business("saga", "order-1", "run-7")
	require.NoError(t, err)
	b.complete(t, "shop", "saga", string(sagaKey), `{}`)
	var lv listView
	r = b.runJSON(t, &lv, "list", "--workflow-id", "order-1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Len(t, lv.Records, 1)
	require.Empty(t, lv.Hint)
	r = b.run(t, "list", "--run-id", "run-7")
	require.NotContains(t, r.errOut, "note:", "no hint without --workflow-id")
	r = b.run(t, "release", "--workflow-id", "order-9")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.errOut, "--run-id")
}

// Under default keys, which hold the run ID and not the workflow ID, list and inspect
// find a workflow's records from its workflow ID, by the origin they carry; records
// written without one are still found by their keys; --activity-type narrows.
func TestList_ByWorkflowIDUnderDefaultKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	write := func(key, op string, o *ledger.Origin) {
		c := ctx
		if o != nil {
			c = ledger.WithOrigin(ctx, *o)
		}
		_, err := b.ledger.Do(c, intent(t, "shop", op, key), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Code: 201, Body: []byte(`{"charge":"ch_1"}`)}, nil
		}, nil)
		require.NoError(t, err)
	}
	charge := ledger.Origin{WorkflowID: "order-1", RunID: "run-a", WorkflowType: "Order", ActivityType: "payments.Charge"}
	write(string(keys.Run("run-a", "5")), "payments.Charge", &charge)
	retry := ledger.Origin{WorkflowID: "order-1", RunID: "run-b", WorkflowType: "Order", ActivityType: "payments.Charge"}
	write(string(keys.Run("run-b", "5")), "payments.Charge", &retry) // a second run charged again
	ship := ledger.Origin{WorkflowID: "order-1", RunID: "run-a", WorkflowType: "Order", ActivityType: "shipping.Ship"}
	write(string(keys.Run("run-a", "6")), "shipping.Ship", &ship)
	write(string(keys.Run("run-z", "5")), "payments.Charge", &ledger.Origin{WorkflowID: "order-2", RunID: "run-z", ActivityType: "payments.Charge"})
	write(string(keys.Workflow("order-1", "9")), "payments.Charge", nil) // written before 004

	keysOf := func(args ...string) []string {
		var lv listView
		r := b.runJSON(t, &lv, append([]string{"list"}, args...)...)
		require.Equal(t, exitOK, r.code, r.errOut)
		var out []string
		for _, v := range lv.Records {
			out = append(out, v.Key)
		}
		return out
	}
	require.ElementsMatch(t, []string{string(keys.Run("run-a", "5")), string(keys.Run("run-b", "5")), string(keys.Run("run-a", "6")),
		string(keys.Workflow("order-1", "9"))}, keysOf("--workflow-id", "order-1"))
	require.ElementsMatch(t, []string{string(keys.Run("run-a", "5")), string(keys.Run("run-b", "5")), string(keys.Workflow("order-1", "9"))},
		keysOf("--workflow-id", "order-1", "--operation", "payments.Charge"))
	require.ElementsMatch(t, []string{string(keys.Run("run-a", "5")), string(keys.Run("run-b", "5")), string(keys.Workflow("order-1", "9"))},
		keysOf("--workflow-id", "order-1", "--activity-type", "payments.Charge"), "the old record has no type: its key decides")
	require.ElementsMatch(t, []string{string(keys.Run("run-a", "5")), string(keys.Run("run-a", "6"))}, keysOf("--run-id", "run-a"))
	require.ElementsMatch(t, []string{string(keys.Run("run-a", "6"))}, keysOf("--activity-type", "shipping.Ship"))

	r := b.run(t, "list", "--run-id", "run-a", "--activity-id", "5", "--activity-type", "payments.Charge")
	require.Equal(t, exitUsage, r.code, r.errOut)
	require.Contains(t, r.errOut, "--activity-type")

	r = b.run(t, "list", "--workflow-id", "order-1", "--operation", "payments.Charge")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "WORKFLOW")
	require.Regexp(t, regexp.MustCompile(`v1:run:run-b:5\s+completed\s+1\s+\S+\s+order-1\s+payments.Charge`), r.out)
	require.NotContains(t, r.errOut, "note:")

	r = b.run(t, "inspect", "shop", "payments.Charge", string(keys.Run("run-b", "5")))
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, `"order-1", run run-b, type Order`)
	require.Regexp(t, `activity type\s+payments.Charge`, r.out)
	var iv inspectView
	b.runJSON(t, &iv, "inspect", "shop", "payments.Charge", string(keys.Run("run-b", "5")))
	require.Equal(t, "order-1", iv.Record.WorkflowID)
	require.Equal(t, "run-b", iv.Record.RunID)
	require.Equal(t, "payments.Charge", iv.Record.ActivityType)
}

// docs/operating.md's table of exit codes says what the command's help says.
func TestExitCodesAsDocumented(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	row := regexp.MustCompile(`(?m)^\| ([0-9]+) \| (.+) \|$`)
	documented := map[int]string{}
	for _, m := range row.FindAllStringSubmatch(string(raw), -1) {
		code, _ := strconv.Atoi(m[1])
		documented[code] = strings.ReplaceAll(m[2], "`", "")
	}
	want := map[int]string{}
	for _, e := range exitCodeTable {
		want[e.code] = e.meaning
	}
	require.Equal(t, want, documented, "docs/operating.md's exit codes and exitCodeTable differ")
	r := oncekit(t, nil, "--help")
	for _, e := range exitCodeTable {
		require.Contains(t, r.out, strconv.Itoa(e.code)+"  "+e.meaning)
	}
}

// Every command's help has examples, and each example is a command line the command
// accepts: its command exists and its flags parse.
func TestExamples_EveryCommand(t *testing.T) {
	t.Parallel()
	root := (&app{}).rootCommand()
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if c.Name() == "help" {
			return
		}
		t.Run(strings.ReplaceAll(c.CommandPath(), " ", "_"), func(t *testing.T) {
			require.NotEmpty(t, c.Example, "%s has no example", c.CommandPath())
			for _, line := range strings.Split(c.Example, "\n") {
				words := shellWords(t, strings.TrimSpace(line))
				require.Equal(t, "oncekit", words[0], line)
				fresh := (&app{}).rootCommand()
				found, rest, err := fresh.Find(words[1:])
				require.NoError(t, err, line)
				require.True(t, found == fresh || strings.HasPrefix(found.CommandPath(), c.CommandPath()) ||
					strings.HasPrefix(c.CommandPath(), found.CommandPath()), "%s: an example of %s runs %s", line, c.CommandPath(), found.CommandPath())
				require.NoError(t, found.ParseFlags(rest), line)
				if found.Args != nil {
					require.NoError(t, found.Args(found, found.Flags().Args()), line)
				}
			}
		})
		n++
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	require.Greater(t, n, 20)
}

// shellWords splits an example's command line as a shell would, up to a redirection
// or a pipe.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord, quote := false, byte(0)
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, inWord = ch, true
		case ch == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '>' || ch == '|':
			i = len(line)
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	require.Zero(t, quote, "unclosed quote in %q", line)
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

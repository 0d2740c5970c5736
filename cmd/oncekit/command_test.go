package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/activity"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// A release of a live lease is refused without --force, and says whose lease it is and
// how long it has left; the record stays.
func TestRelease_LiveLeaseNeedsForce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lease := b.claim(t, "acme", "payments.charge", "c-live", time.Hour)

	r := b.run(t, "release", "acme", "payments.charge", "c-live")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.Contains(t, r.out, "lease is live", "not the wording of a stuck record")
	require.Contains(t, r.out, lease.Token.String())
	require.Contains(t, r.out, "left")
	r = b.run(t, "release", "acme", "payments.charge", "c-live", "--yes", "--reason", "INC-1")
	require.Equal(t, exitRefused, r.code, r.errOut)
	require.Contains(t, r.out, "--force")
	_, err := b.ledger.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: "payments.charge"}, "c-live")
	require.NoError(t, err, "the record stays")

	r = b.run(t, "release", "acme", "payments.charge", "c-live", "--yes", "--reason", "INC-1: the worker host is gone", "--force")
	require.Equal(t, exitOK, r.code, r.errOut)
	_, err = b.ledger.Get(context.Background(), keys.Scope{Tenant: "acme", Operation: "payments.charge"}, "c-live")
	require.ErrorIs(t, err, ledger.ErrNotFound)
}

// A release is shown first (owner, lease, state) and made only with -y and --reason; it
// keeps an audit row, which inspect shows after the record is gone.
func TestRelease_DryRunThenAudit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lease := b.stuck(t, "acme", "payments.charge", "c-stuck")

	var plan planView
	r := b.runJSON(t, &plan, "release", "acme", "payments.charge", "c-stuck")
	require.Equal(t, exitRefused, r.code)
	require.True(t, plan.DryRun)
	require.Len(t, plan.Records, 1)
	require.Equal(t, lease.Token.String(), plan.Records[0].OwnerToken)
	require.True(t, plan.Records[0].Stuck)
	require.Empty(t, plan.Done)
	require.Contains(t, r.errOut, "--yes")

	r = b.run(t, "release", "acme", "payments.charge", "c-stuck", "-y")
	require.Equal(t, exitUsage, r.code, "a change needs a reason")
	require.Contains(t, r.errOut, "--reason")

	r = b.run(t, "release", "acme", "payments.charge", "c-stuck", "-y", "--reason", "INC-7: worker OOM-killed", "--actor", "alice")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "released")

	var iv inspectView
	r = b.runJSON(t, &iv, "inspect", "acme", "payments.charge", "c-stuck")
	require.Equal(t, exitNotFound, r.code)
	require.Nil(t, iv.Record)
	require.Len(t, iv.Audit, 1)
	require.Equal(t, "alice", iv.Audit[0].Actor)
	require.Equal(t, "INC-7: worker OOM-killed", iv.Audit[0].Reason)
	require.Equal(t, "pending", iv.Audit[0].Before.State)
	require.Equal(t, lease.Token.String(), iv.Audit[0].Before.OwnerToken)
	r = b.run(t, "inspect", "acme", "payments.charge", "c-stuck")
	require.Contains(t, r.out, "released by alice")
}

// Releases and evictions by filter list what they would change first; a release by
// filter leaves live leases alone, and an eviction by state evicts that state only.
func TestChange_Bulk(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stuck(t, "acme", "payments.charge", "s-1")
	b.stuck(t, "acme", "payments.charge", "s-2")
	b.claim(t, "acme", "payments.charge", "live", time.Hour)
	b.stuck(t, "globex", "payments.charge", "other-tenant")
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	c, err := b.ledger.Claim(context.Background(), intent(t, "acme", "orders.create", "o-2"), nil)
	require.NoError(t, err)
	require.NoError(t, b.ledger.Fail(context.Background(), c.Lease, ledger.Definitive("declined", "no")))

	var plan planView
	r := b.runJSON(t, &plan, "release", "--tenant", "acme", "--operation", "payments.charge")
	require.Equal(t, exitRefused, r.code)
	require.Len(t, plan.Records, 2, "only those whose lease ran out")
	r = b.run(t, "release", "--tenant", "acme", "--operation", "payments.charge", "-y", "--reason", "INC-9")
	require.Equal(t, exitOK, r.code, r.errOut)
	recs, err := b.ledger.List(context.Background(), &ledger.ListOpts{State: ledger.StatePending})
	require.NoError(t, err)
	require.Len(t, recs, 2, "the live lease and the other tenant's stay")

	r = b.runJSON(t, &plan, "evict", "--tenant", "acme", "--state", "failed", "-y", "--reason", "INC-9")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Len(t, plan.Done, 1)
	require.Equal(t, "o-2", plan.Done[0].Before.Key)
	require.Equal(t, exitUsage, b.run(t, "release", "-y", "--reason", "x").code, "a bulk change needs a filter")
	require.Equal(t, exitUsage, b.run(t, "evict", "--state", "pending").code)
}

// Every command describes itself and each of its flags under --help, and exits 0.
func TestHelp_EveryCommand(t *testing.T) {
	t.Parallel()
	root := (&app{}).rootCommand()
	var paths [][]string
	var walk func(prefix []string, cmds []*cobra.Command)
	walk = func(prefix []string, cmds []*cobra.Command) {
		for _, c := range cmds {
			p := append(append([]string{}, prefix...), c.Name())
			paths = append(paths, p)
			walk(p, c.Commands())
		}
	}
	walk(nil, root.Commands())
	require.Greater(t, len(paths), 12)
	for _, p := range paths {
		t.Run(strings.Join(p, "_"), func(t *testing.T) {
			t.Parallel()
			r := oncekit(t, nil, append(p, "--help")...)
			require.Equal(t, exitOK, r.code, r.errOut)
			require.Contains(t, r.out, "Usage:")
			// A tree of its own: cobra merges flags as it looks a command up.
			cmd, _, err := (&app{}).rootCommand().Find(p)
			require.NoError(t, err)
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				require.NotEmpty(t, f.Usage, "--%s has no description", f.Name)
				require.Contains(t, r.out, "--"+f.Name)
			})
		})
	}
}

// list --help is help, not a usage error.
func TestHelp_ListExitsZero(t *testing.T) {
	t.Parallel()
	r := oncekit(t, nil, "list", "--help")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "--workflow-id")
	require.NotContains(t, r.errOut, "help requested")
}

// A schema a newer oncekit migrated is refused by every command, and migrate status
// names what this build does not know.
func TestSchema_AheadIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{b.schema, "oncekit_migrations"}.Sanitize()+
		" (line, version, name) VALUES ('ledger', 99, 'from_the_future')")
	require.NoError(t, err)
	for _, args := range [][]string{{"status"}, {"list"}, {"inspect", "a", "b", "c"}, {"migrate"}, {"outbox", "dead"}, {"purge"}} {
		r := b.run(t, args...)
		require.Equal(t, exitSchema, r.code, "%v: %s", args, r.errOut)
		require.Contains(t, r.errOut, "ledger/099_from_the_future", args)
	}
	r := b.run(t, "migrate", "status")
	require.Equal(t, exitSchema, r.code)
	require.Contains(t, r.out, "by a newer oncekit")
}

// A schema without oncekit's tables, or lacking one, gets "run oncekit migrate", not a
// raw SQLSTATE.
func TestSchema_MissingTablesSayMigrate(t *testing.T) {
	t.Parallel()
	_, empty := pgtest.NewSchema(t)
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	for _, args := range [][]string{{"status"}, {"list"}, {"inspect", "a", "b", "c"}, {"outbox", "dead"}} {
		r := oncekit(t, env, append(args, "--schema", empty)...)
		require.Equal(t, exitSchema, r.code, "%v: %s", args, r.errOut)
		require.Contains(t, r.errOut, "oncekit migrate", args)
		require.NotContains(t, r.errOut, "42P01", args)
	}

	b := setup(t)
	_, err := b.pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{b.schema, "idempotency_audit"}.Sanitize()+
		"; DELETE FROM "+pgx.Identifier{b.schema, "oncekit_migrations"}.Sanitize()+" WHERE line = 'ledger' AND version = 3")
	require.NoError(t, err)
	r := b.run(t, "inspect", "a", "b", "c")
	require.Equal(t, exitSchema, r.code, r.errOut)
	require.Contains(t, r.errOut, "lacks 1 migrations")
	require.Contains(t, r.errOut, "run `oncekit migrate`")
	require.NotContains(t, r.errOut, "42P01")

	r = b.run(t, "migrate", "status")
	require.Equal(t, exitPending, r.code, r.errOut)
	require.Contains(t, r.out, "003_operator_audit")
	require.Contains(t, r.out, "pending")
	require.Contains(t, r.errOut, "1 migration pending")
	r = b.run(t, "migrate")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "applied  ledger/003_operator_audit")
}

// Records are found by the Temporal identities their keys are made of, by key prefix,
// tenant and time; list says when more match and pages through them.
func TestList_FindsAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runKey := func(run, act string) string { return string(keys.Run(run, act)) }
	wfKey, err := keys.Identity{WorkflowID: "order-42", ActivityID: "7"}.Key(keys.WorkflowScoped)
	require.NoError(t, err)
	sagaKey, err := keys.Business("saga", "order-42", "run-a")
	require.NoError(t, err)
	for _, k := range []string{runKey("run-a", "5"), runKey("run-a", "6"), runKey("run_b%", "5"), string(wfKey), string(sagaKey), "plain-key"} {
		b.complete(t, "acme", "payments.charge", k, `{}`)
	}
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
	require.ElementsMatch(t, []string{runKey("run-a", "5"), runKey("run-a", "6"), string(sagaKey)}, keysOf("--run-id", "run-a"))
	require.ElementsMatch(t, []string{runKey("run_b%", "5")}, keysOf("--run-id", "run_b%"), "LIKE's wildcards in an ID are literal")
	require.ElementsMatch(t, []string{runKey("run-a", "5"), runKey("run_b%", "5")}, keysOf("--activity-id", "5"))
	require.ElementsMatch(t, []string{string(wfKey), string(sagaKey)}, keysOf("--workflow-id", "order-42"))
	require.ElementsMatch(t, []string{runKey("run-a", "6")}, keysOf("--run-id", "run-a", "--activity-id", "6"))
	require.ElementsMatch(t, []string{"plain-key"}, keysOf("--key-prefix", "plain"))
	require.Empty(t, keysOf("--tenant", "globex"))
	require.Empty(t, keysOf("--since", "2999-01-01T00:00:00Z"))
	require.Len(t, keysOf("--since", "1h"), 6)

	var seen []string
	args := []string{"list", "--limit", "4"}
	for page := 0; ; page++ {
		require.Less(t, page, 3)
		var lv listView
		r := b.runJSON(t, &lv, args...)
		require.Equal(t, exitOK, r.code, r.errOut)
		for _, v := range lv.Records {
			seen = append(seen, v.Key)
		}
		if !lv.More {
			require.Nil(t, lv.NextCursor)
			break
		}
		args = []string{"list", "--limit", "4", "--after", *lv.NextCursor}
	}
	require.Len(t, seen, 6)
	r := b.run(t, "list", "--limit", "4")
	require.Contains(t, r.errOut, "more records match: add --after ")

	for _, bad := range []string{"0", "-1", "1001"} {
		r := b.run(t, "list", "--limit", bad)
		require.Equal(t, exitUsage, r.code, bad)
		require.Contains(t, r.errOut, "--limit")
	}
	require.Equal(t, exitUsage, b.run(t, "list", "--after", "garbage").code)
	require.Equal(t, exitUsage, b.run(t, "list", "--since", "yesterday").code)
}

// inspect shows what the key is made of, the downstream key an activity sent its
// provider, and marks an expired record; it prints the stored body only on request.
func TestInspect_DownstreamKeyExpiryAndRedaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := string(keys.Run("run-a", "5"))
	b.complete(t, "acme", "payments.charge", key, `{"card":"4242 4242 4242 4242"}`)
	want, err := keys.DeriveIn(keys.Scope{Tenant: "acme", Operation: "payments.charge"}, keys.Key(key), activity.PurposeDefault)
	require.NoError(t, err)
	require.Equal(t, activity.PurposeDefault, purposeDefault)

	r := b.run(t, "inspect", "acme", "payments.charge", key)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.NotContains(t, r.out, "4242", "the body is not printed by default")
	require.Contains(t, r.out, "--show-body")
	require.Contains(t, r.out, string(want))
	require.Contains(t, r.out, `run-scoped activity key: run ID "run-a", activity ID "5"`)
	r = b.run(t, "inspect", "acme", "payments.charge", key, "--show-body")
	require.Contains(t, r.out, "4242 4242")

	_, err = b.pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+
		" SET expires_at = now() - interval '1 hour'")
	require.NoError(t, err)
	var iv inspectView
	r = b.runJSON(t, &iv, "inspect", "acme", "payments.charge", key)
	require.Equal(t, exitOK, r.code, r.errOut)
	require.True(t, iv.Record.Expired)
	require.Nil(t, iv.Record.Body)
	require.Equal(t, string(want), iv.Record.DownstreamKey)
	require.Equal(t, []auditView{}, iv.Audit)
	r = b.run(t, "inspect", "acme", "payments.charge", key)
	require.Contains(t, r.out, "expired")
}

// Retrying dead events by ID is all or nothing, by topic or --all needs -y after a dry
// run, and --json reports each ID.
func TestOutbox_InspectDeadRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	out, err := outbox.New(b.pool, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	enqueue := func(topic string) uuid.UUID {
		var id uuid.UUID
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			ids, err := out.Enqueue(ctx, tx, outbox.Event{Topic: topic, Payload: []byte(`{"secret":1}`)})
			id = ids[0]
			return err
		}))
		return id
	}
	a1, a2, c1 := enqueue("a"), enqueue("a"), enqueue("c")
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return outbox.ErrPermanent }), nil)
	require.NoError(t, err)
	_, err = d.Drain(ctx)
	require.NoError(t, err)
	pending := enqueue("a")

	r := b.run(t, "outbox", "inspect", a1.String())
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "dead")
	require.NotContains(t, r.out, "secret")
	require.Equal(t, exitNotFound, b.run(t, "outbox", "inspect", uuid.NewString()).code)
	require.Equal(t, exitUsage, b.run(t, "outbox", "inspect", "nope").code)

	var dead []eventView
	r = b.runJSON(t, &dead, "outbox", "dead", "--topic", "a")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Len(t, dead, 2)

	r = b.run(t, "outbox", "retry", a1.String(), pending.String(), "--reason", "INC-1")
	require.Equal(t, exitWrongState, r.code, r.errOut)
	require.Contains(t, r.errOut, pending.String())
	require.Contains(t, r.errOut, "nothing was retried")
	e, err := out.Get(ctx, a1)
	require.NoError(t, err)
	require.Equal(t, outbox.StateDead, e.State, "all or nothing")

	var rv retryView
	r = b.runJSON(t, &rv, "outbox", "retry", "--topic", "a")
	require.Equal(t, exitRefused, r.code)
	require.Equal(t, []string{a1.String(), a2.String()}, rv.WouldRetry)
	r = b.runJSON(t, &rv, "outbox", "retry", "--topic", "a", "-y", "--reason", "INC-1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []string{a1.String(), a2.String()}, rv.Retried)
	r = b.runJSON(t, &rv, "outbox", "retry", "--all", "--yes", "--reason", "INC-1")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []string{c1.String()}, rv.Retried)
	require.Equal(t, exitUsage, b.run(t, "outbox", "retry").code)
	require.Equal(t, exitUsage, b.run(t, "outbox", "retry", "--all", "--topic", "a").code)
}

// purge counts what it would delete from each table, then deletes it with -y; the inbox
// and outbox have purges of their own.
func TestPurge_DryRunNamesTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.complete(t, "acme", "orders.create", "o-1", `{}`)
	b.complete(t, "acme", "orders.create", "o-2", `{}`)
	_, err := b.pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+
		" SET expires_at = now() - interval '1 hour' WHERE key = 'o-1'")
	require.NoError(t, err)

	var pv purgeView
	r := b.runJSON(t, &pv, "purge")
	require.Equal(t, exitRefused, r.code)
	require.True(t, pv.DryRun)
	counts := map[string]int64{}
	for _, tb := range pv.Tables {
		counts[strings.TrimPrefix(tb.Table, b.schema+".")] = tb.Count
	}
	require.Equal(t, map[string]int64{"idempotency_records": 1, "agent_calls": 0, "inbox_messages": 0, "outbox_events": 0}, counts)
	r = b.run(t, "purge", "-y", "--pause", "-1s")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "--pause must not be negative")
	r = b.run(t, "purge", "-y", "--batch", "1", "--pause", "10ms")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "purged  "+b.schema+".idempotency_records  1 expired records")
	r = b.run(t, "purge")
	require.Equal(t, exitOK, r.code, "nothing left to purge")

	r = b.run(t, "inbox", "purge")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "inbox_messages")
	r = b.run(t, "outbox", "purge", "--published-retention", "1h")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "outbox_events")
	var subs []subscriberView
	r = b.runJSON(t, &subs, "inbox", "status")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Equal(t, []subscriberView{}, subs)
}

// The conventions: --database-url beside DATABASE_URL, the PG* variables, one error
// prefix, a redacted password, version, completion, snake_case JSON with [] for empty
// lists.
func TestConventions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := pgtest.URL(t)

	r := oncekit(t, nil, "status", "--database-url", url, "--schema", b.schema)
	require.Equal(t, exitOK, r.code, r.errOut)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	pgEnv := []string{"PGHOST=" + cfg.Host, fmt.Sprintf("PGPORT=%d", cfg.Port), "PGUSER=" + cfg.User, "PGDATABASE=" + cfg.Database, "PGPASSWORD=" + cfg.Password}
	r = oncekit(t, pgEnv, "status", "--schema", b.schema)
	require.Equal(t, exitOK, r.code, "the PG* variables: %s", r.errOut)

	r = oncekit(t, []string{"DATABASE_URL=postgres://nobody:s3cret-pw@127.0.0.1:1/none?connect_timeout=2"}, "status")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.errOut, "cannot reach the database")
	require.NotContains(t, r.errOut, "s3cret-pw")
	r = oncekit(t, []string{"DATABASE_URL=postgres://nobody:s3cret-pw@[::1"}, "status")
	require.Equal(t, exitUsage, r.code)
	require.NotContains(t, r.errOut, "s3cret-pw")

	for _, args := range [][]string{{"frobnicate"}, {"inspect", "acme"}, {"list", "--nope"}, {"outbox", "frob"}} {
		r := oncekit(t, b.env, args...)
		require.Equal(t, exitUsage, r.code, args)
		require.True(t, strings.HasPrefix(r.errOut, "oncekit: "), "%v: %q", args, r.errOut)
		require.Equal(t, 1, strings.Count(r.errOut, "\n"), "one line: %q", r.errOut)
		require.Contains(t, r.errOut, "--help describes the command")
	}

	r = oncekit(t, nil, "version")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "ledger 4")
	r = oncekit(t, nil, "--version")
	require.Equal(t, exitOK, r.code)
	require.True(t, strings.HasPrefix(r.out, "oncekit "))
	r = oncekit(t, nil, "completion", "bash")
	require.Equal(t, exitOK, r.code, r.errOut)
	require.Contains(t, r.out, "oncekit")

	var raw map[string]json.RawMessage
	r = b.runJSON(t, &raw, "status")
	require.Equal(t, exitOK, r.code, r.errOut)
	for k, v := range raw {
		require.Equal(t, strings.ToLower(k), k, "snake_case keys")
		if k != "oldest_pending" { // null when no record is pending
			require.NotEqual(t, "null", string(v), "%s is null", k)
		}
	}
	require.Equal(t, "[]", string(raw["inbox"]))
	var lv map[string]json.RawMessage
	b.runJSON(t, &lv, "list")
	require.Equal(t, "[]", string(lv["records"]))
}

// Durations and cut text read as a person writes them.
func TestShortDurationAndClip(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{168 * time.Hour: "168h", 90 * time.Minute: "1h30m", 10 * time.Minute: "10m",
		90 * time.Second: "1m30s", 0: "0s", 1500 * time.Millisecond: "1.5s"} {
		require.Equal(t, want, shortDuration(d), d)
	}
	require.Equal(t, "short", clip("short", 10))
	require.Equal(t, "abc…", clip("abcdef", 3))
	require.Equal(t, "a…", clip("aéb", 2), "not in the middle of a character")
}

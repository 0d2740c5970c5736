package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

// The test binary doubles as the oncekit command, run as a subprocess.
func TestMain(m *testing.M) {
	if os.Getenv("ONCEKIT_TEST_RUN_COMMAND") == "1" {
		main()
	}
	pgtest.Main(m)
}

type result struct {
	code        int
	out, errOut string
}

func oncekit(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "ONCEKIT_TEST_RUN_COMMAND=1"), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{code, out.String(), errOut.String()}
}

func intent(t *testing.T, tenant, op, key string) ledger.Intent {
	fp, err := keys.FingerprintJSON(key)
	require.NoError(t, err)
	return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Key(key), Fingerprint: fp}
}

// The command against a real schema: migrate, status, inspect, list, release, evict,
// purge and the outbox's dead events, in text and JSON, with the documented exit codes.
func TestCommand_EndToEnd(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewSchema(t)
	ctx := context.Background()
	schema := "cmd_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	s := "--schema=" + schema

	r := oncekit(t, env, "migrate", s)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "applied  ledger/001_idempotency_records")
	r = oncekit(t, env, "migrate", s)
	require.Contains(t, r.out, "is current")
	r = oncekit(t, nil, "migrate", "--print", s)
	require.Equal(t, 0, r.code)
	require.Contains(t, r.out, "CREATE TABLE IF NOT EXISTS idempotency_records")
	script, err := migrate.Script(schema)
	require.NoError(t, err)
	require.Equal(t, script, r.out)

	// Some records: one completed, one stuck pending, one failed, one expired.
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	_, err = l.Do(ctx, intent(t, "acme", "orders.create", "o-1"), func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{Code: 201, Body: []byte(`{"order":"o-1"}`)}, nil
	}, nil)
	require.NoError(t, err)
	_, err = l.Claim(ctx, intent(t, "acme", "payments.charge", "c-1"), &ledger.ClaimOpts{Lease: time.Millisecond})
	require.NoError(t, err)
	c2, err := l.Claim(ctx, intent(t, "acme", "payments.charge", "c-2"), nil)
	require.NoError(t, err)
	require.NoError(t, l.Fail(ctx, c2.Lease, ledger.Definitive("card_declined", "declined")))
	_, err = l.Do(ctx, intent(t, "globex", "orders.create", "old"), func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{}, nil
	}, &ledger.DoOpts{Retention: time.Millisecond})
	require.NoError(t, err)
	out, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	var deadID uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "t", Payload: []byte(`{}`)})
		deadID = ids[0]
		return err
	}))
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error { return outbox.ErrPermanent }), nil)
	require.NoError(t, err)
	_, err = d.Drain(ctx)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond) // the stuck lease and the short retention run out

	r = oncekit(t, env, "status", s)
	require.Equal(t, 0, r.code, r.errOut)
	for _, want := range []string{"migrations", "ledger 2, webhook 1, inbox 1, outbox 3", "completed  orders.create", "pending    payments.charge  1",
		"stuck (lease ran out)    1", "expired, awaiting purge  1", "0 pending, 0 published, 1 dead"} {
		require.Contains(t, r.out, want)
	}
	r = oncekit(t, env, "status", s, "--json")
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(r.out), &st))
	require.Equal(t, int64(1), st.Stuck)
	require.Equal(t, 1, st.Outbox.Dead)

	r = oncekit(t, env, "inspect", "acme", "orders.create", "o-1", s)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, `15 bytes: {"order":"o-1"}`)
	r = oncekit(t, env, "inspect", "acme", "orders.create", "nope", s)
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.errOut, "oncekit list --tenant acme")

	r = oncekit(t, env, "list", "--stuck", s, "--json")
	require.Equal(t, 0, r.code, r.errOut)
	var stuck []recordView
	require.NoError(t, json.Unmarshal([]byte(r.out), &stuck))
	require.Len(t, stuck, 1)
	require.Equal(t, "c-1", stuck[0].Key)
	r = oncekit(t, env, "list", "--state", "failed", s)
	require.Contains(t, r.out, "c-2")
	require.NotContains(t, r.out, "o-1")
	r = oncekit(t, env, "list", "--state", "gone", s)
	require.Equal(t, exitUsage, r.code)

	// Changes need --yes, say what they would do, and refuse the wrong state.
	r = oncekit(t, env, "release", "acme", "payments.charge", "c-1", s)
	require.Equal(t, exitRefused, r.code)
	require.Contains(t, r.errOut, "would release the pending record")
	r = oncekit(t, env, "release", "acme", "orders.create", "o-1", s, "--yes")
	require.Equal(t, exitNotFound, r.code)
	require.Contains(t, r.errOut, "evict it instead")
	r = oncekit(t, env, "release", "acme", "payments.charge", "c-1", "--yes", s)
	require.Equal(t, 0, r.code, r.errOut)
	_, err = l.Get(ctx, keys.Scope{Tenant: "acme", Operation: "payments.charge"}, "c-1")
	require.ErrorIs(t, err, ledger.ErrNotFound)
	r = oncekit(t, env, "evict", "acme", "orders.create", "o-1", s, "--yes")
	require.Equal(t, 0, r.code, r.errOut)
	res, err := l.Do(ctx, intent(t, "acme", "orders.create", "o-1"), func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{Code: 201}, nil
	}, nil)
	require.NoError(t, err)
	require.False(t, res.Replayed, "an evicted key runs again")

	r = oncekit(t, env, "purge", s, "--batch", "1")
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "purged 1 expired records")
	require.Contains(t, r.errOut, "batch 1 deleted 1")

	r = oncekit(t, env, "outbox", "dead", s)
	require.Contains(t, r.out, deadID.String())
	r = oncekit(t, env, "outbox", "retry", deadID.String(), s)
	require.Equal(t, 0, r.code, r.errOut)
	r = oncekit(t, env, "outbox", "retry", deadID.String(), s)
	require.Equal(t, exitNotFound, r.code)

	// Usage and connection errors name the fix.
	require.Equal(t, exitUsage, oncekit(t, env, "frobnicate").code)
	require.Equal(t, exitUsage, oncekit(t, env, "inspect", "acme").code)
	r = oncekit(t, []string{"DATABASE_URL="}, "status")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.errOut, "DATABASE_URL is not set")
	r = oncekit(t, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, "status")
	require.Equal(t, exitFailed, r.code)
	require.Contains(t, r.errOut, "cannot reach the database")
}

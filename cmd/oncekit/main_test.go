package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

// The test binary doubles as the oncekit command, run as a subprocess. With
// ONCEKIT_TEST_BINARY set, the tests run that binary instead, such as an older build,
// to see which of them it fails.
func TestMain(m *testing.M) {
	if os.Getenv("ONCEKIT_TEST_RUN_COMMAND") == "1" {
		main()
	}
	pgtest.Main(m)
}

// result is what one run of the command did.
type result struct {
	code        int
	out, errOut string
}

// bundle is a migrated schema and what the tests seed it with.
type bundle struct {
	pool   *pgxpool.Pool
	schema string
	env    []string
	ledger *ledger.Ledger
}

// setup migrates a fresh schema and returns it with the environment that points the
// command at it.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(context.Background(), pool, schema)
	require.NoError(t, err)
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{pool: pool, schema: schema, env: []string{"DATABASE_URL=" + pgtest.URL(t)}, ledger: l}
}

// run runs the command with the bundle's database and schema.
func (b *bundle) run(t *testing.T, args ...string) result {
	t.Helper()
	return oncekit(t, b.env, append(args, "--schema", b.schema)...)
}

// runJSON runs the command with --json and decodes its standard output into v.
func (b *bundle) runJSON(t *testing.T, v any, args ...string) result {
	t.Helper()
	r := b.run(t, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(r.out), v), "stdout: %s\nstderr: %s", r.out, r.errOut)
	return r
}

func oncekit(t *testing.T, env []string, args ...string) result {
	t.Helper()
	bin := os.Getenv("ONCEKIT_TEST_BINARY")
	if bin == "" {
		bin = os.Args[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "ONCEKIT_TEST_RUN_COMMAND=1", "DATABASE_URL="), env...)
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
	t.Helper()
	fp, err := keys.FingerprintJSON(key)
	require.NoError(t, err)
	return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Key(key), Fingerprint: fp}
}

// complete records a completed intent with body.
func (b *bundle) complete(t *testing.T, tenant, op, key, body string) {
	t.Helper()
	_, err := b.ledger.Do(context.Background(), intent(t, tenant, op, key), func(context.Context, pgx.Tx) (ledger.Response, error) {
		return ledger.Response{Code: 201, Body: []byte(body)}, nil
	}, nil)
	require.NoError(t, err)
}

// claim records a pending claim with lease.
func (b *bundle) claim(t *testing.T, tenant, op, key string, lease time.Duration) *ledger.Lease {
	t.Helper()
	res, err := b.ledger.Claim(context.Background(), intent(t, tenant, op, key), &ledger.ClaimOpts{Lease: lease})
	require.NoError(t, err)
	return res.Lease
}

// stuck records a pending claim whose lease has run out, by moving the lease into the
// past: no test waits for a clock.
func (b *bundle) stuck(t *testing.T, tenant, op, key string) *ledger.Lease {
	t.Helper()
	lease := b.claim(t, tenant, op, key, time.Hour)
	_, err := b.pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{b.schema, "idempotency_records"}.Sanitize()+
		" SET lease_until = now() - interval '10 minutes' WHERE tenant = $1 AND operation = $2 AND key = $3", tenant, op, key)
	require.NoError(t, err)
	return lease
}

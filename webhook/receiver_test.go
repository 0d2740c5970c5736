package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var secret = []byte("webhook-test-secret")

type issueEvent struct {
	Issue   string `json:"issue"`
	Version int64  `json:"version"`
	Title   string `json:"title"`
	Fail    bool   `json:"fail"`
}

type bundle struct {
	srv   *httptest.Server
	pool  *pgxpool.Pool
	calls atomic.Int32
	fail  atomic.Bool
}

// setup serves a GitHub-style receiver whose handler records the issue's latest title,
// ignoring events older than one already applied.
func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, nil)
}

// setupOn is setup with the ledger on the pool ledgerPool returns for the test's schema
// (nil: the test's own pool).
func setupOn(t *testing.T, ledgerPool func(schema string) *pgxpool.Pool) *bundle {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.NewStore(t, pgtest.Migrator(migrate.Up), `CREATE TABLE issues (id text PRIMARY KEY, title text NOT NULL);
		CREATE TABLE receipts (delivery text NOT NULL)`)
	lp := pool
	if ledgerPool != nil {
		lp = ledgerPool(schema)
	}
	l, err := ledger.New(lp, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	b := &bundle{pool: pool}
	h, err := webhook.New(ctx, &webhook.Config{Ledger: l, Verifier: webhook.GitHub(secret), Source: "github",
		Handle: func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
			b.calls.Add(1)
			var ev issueEvent
			if err := json.Unmarshal(d.Body, &ev); err != nil {
				return ledger.Definitive("malformed_event", err.Error())
			}
			if _, err := tx.Exec(ctx, `INSERT INTO receipts (delivery) VALUES ($1)`, d.ID); err != nil {
				return err
			}
			if b.fail.Load() {
				return errors.New("downstream unavailable")
			}
			newer, err := d.Newer(ctx, "issue/"+ev.Issue, ev.Version)
			if err != nil || !newer {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO issues (id, title) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET title = excluded.title`, ev.Issue, ev.Title)
			return err
		}})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b
}

func sign(body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func (b *bundle) deliver(t *testing.T, id string, body []byte, signature string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-GitHub-Delivery", id)
	req.Header.Set("X-GitHub-Event", "issues")
	if signature != "" {
		req.Header.Set("X-Hub-Signature-256", signature)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct{ Status string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Status
}

func (b *bundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// A webhook is replayed with the same delivery ID: it is acknowledged without running
// again.
func TestReceiver_ReplayedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body, _ := json.Marshal(issueEvent{Issue: "1", Version: 1, Title: "first"})
	status, state := b.deliver(t, "d-1", body, sign(body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusProcessed, state)
	status, state = b.deliver(t, "d-1", body, sign(body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusDuplicate, state)
	require.Equal(t, int32(1), b.calls.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM receipts`))
}

// A missing or bad signature is refused before any database work.
func TestReceiver_BadSignature(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := []byte(`{"issue":"1","version":1,"title":"x"}`)
	for _, sig := range []string{"", "sha256=deadbeef", sign([]byte("other body"))} {
		status, _ := b.deliver(t, "d-bad", body, sig)
		require.Equal(t, http.StatusUnauthorized, status)
	}
	require.Equal(t, int32(0), b.calls.Load())
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM receipts`))
}

// A delivery whose handler failed is processed when it is redelivered: the ledger
// records the outcome, not mere presence.
func TestReceiver_FailedDeliveryIsProcessedOnRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body, _ := json.Marshal(issueEvent{Issue: "2", Version: 1, Title: "t"})
	b.fail.Store(true)
	status, _ := b.deliver(t, "d-2", body, sign(body))
	require.Equal(t, http.StatusInternalServerError, status)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM receipts`), "the failed attempt's receipt rolled back")
	b.fail.Store(false)
	status, state := b.deliver(t, "d-2", body, sign(body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusProcessed, state)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM issues WHERE id = '2'`))
}

// An older event that arrives after a newer one is ignored.
func TestReceiver_OutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v2, _ := json.Marshal(issueEvent{Issue: "3", Version: 2, Title: "renamed"})
	v1, _ := json.Marshal(issueEvent{Issue: "3", Version: 1, Title: "original"})
	status, _ := b.deliver(t, "d-v2", v2, sign(v2))
	require.Equal(t, http.StatusOK, status)
	status, state := b.deliver(t, "d-v1", v1, sign(v1))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusProcessed, state)
	var title string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT title FROM issues WHERE id = '3'`).Scan(&title))
	require.Equal(t, "renamed", title)
}

// A malformed event is refused definitively: acknowledged, stored, never run again.
func TestReceiver_RefusedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := []byte(`{"issue":`)
	_, state := b.deliver(t, "d-bad-json", body, sign(body))
	require.Equal(t, webhook.StatusRefused, state)
	_, state = b.deliver(t, "d-bad-json", body, sign(body))
	require.Equal(t, webhook.StatusRefused, state)
	require.Equal(t, int32(1), b.calls.Load())

	other := []byte(`{"issue":"9","version":1,"title":"x"}`)
	status, _ := b.deliver(t, "d-bad-json", other, sign(other))
	require.Equal(t, http.StatusUnprocessableEntity, status, "same delivery ID, another body")
}

// A delivery redelivered after its record's retention is a new delivery, processed
// again: once. The test counts the handler's calls, not committed rows, since a call
// that runs the handler twice still commits once.
func TestReceiver_RedeliveryAfterRetentionRunsHandlerOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	l, err := ledger.New(pool, &ledger.Config{Schema: schema, Retention: time.Hour, Test: ledger.TestConfig{NowFunc: clock}})
	require.NoError(t, err)
	var calls atomic.Int32
	h, err := webhook.New(ctx, &webhook.Config{Ledger: l, Verifier: webhook.GitHub(secret), Source: "github",
		Handle: func(context.Context, pgx.Tx, webhook.Delivery) error {
			calls.Add(1)
			return nil
		}})
	require.NoError(t, err)
	b := &bundle{srv: httptest.NewServer(h), pool: pool}
	defer b.srv.Close()

	body := []byte(`{"issue":"7","version":1,"title":"t"}`)
	_, state := b.deliver(t, "d-late", body, sign(body))
	require.Equal(t, webhook.StatusProcessed, state)
	_, state = b.deliver(t, "d-late", body, sign(body))
	require.Equal(t, webhook.StatusDuplicate, state)

	mu.Lock()
	now = now.Add(time.Hour + time.Minute)
	mu.Unlock()
	status, state := b.deliver(t, "d-late", body, sign(body))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, webhook.StatusProcessed, state, "an expired record is absent")
	require.Equal(t, int32(2), calls.Load(), "the redelivery ran the handler once")
	_, state = b.deliver(t, "d-late", body, sign(body))
	require.Equal(t, webhook.StatusDuplicate, state)
	require.Equal(t, int32(2), calls.Load())
}

// A schema without the webhook line's table is refused when the receiver is made, with
// an error that names the migration to run, instead of a 500 on every delivery that
// calls Delivery.Newer; so is one without the ledger's table.
func TestNew_RefusesSchemaWithoutTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	handle := func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }
	for _, tc := range []struct {
		name    string
		migrate func(*pgxpool.Pool, string) error
		missing string
	}{
		{"LedgerLineOnly", func(pool *pgxpool.Pool, schema string) error {
			_, err := ledger.Migrate(ctx, pool, schema)
			return err
		}, "entity_versions"},
		{"Nothing", func(*pgxpool.Pool, string) error { return nil }, "idempotency_records"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, schema := pgtest.NewSchema(t)
			require.NoError(t, tc.migrate(pool, schema))
			l, err := ledger.New(pool, &ledger.Config{Schema: schema})
			require.NoError(t, err)
			_, err = webhook.New(ctx, &webhook.Config{Ledger: l, Verifier: webhook.GitHub(secret), Source: "github", Handle: handle})
			require.ErrorIs(t, err, webhook.ErrSchema)
			var serr *webhook.SchemaError
			require.ErrorAs(t, err, &serr)
			require.Equal(t, schema, serr.Schema)
			require.Equal(t, tc.missing, serr.Table)
			require.Contains(t, err.Error(), "migrate.Up")
		})
	}
}

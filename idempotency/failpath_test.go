package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/ledger"
)

// skuServer serves POST /skus/{sku}: it writes an audit row, then inserts the SKU, and
// answers a unique violation with the status given in the "conflict" query parameter
// (ignoring the failed statement when it is 201, as a careless handler would).
type skuServer struct {
	srv   *httptest.Server
	calls atomic.Int64
}

func newSKUServer(t *testing.T, pool *pgxpool.Pool, schema string) *skuServer {
	t.Helper()
	l, err := ledger.New(pool, &ledger.Config{Schema: schema})
	require.NoError(t, err)
	mw, err := idempotency.New(&idempotency.Config{Ledger: l, TenantFunc: idempotency.FixedTenant("acme")})
	require.NoError(t, err)
	s := &skuServer{}
	mux := http.NewServeMux()
	mux.Handle("POST /skus/{sku}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		tx, _ := idempotency.Tx(r)
		sku := r.PathValue("sku")
		if _, err := tx.Exec(r.Context(), `INSERT INTO audit (what) VALUES ($1)`, "tried "+sku); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err := tx.Exec(r.Context(), `INSERT INTO skus (sku) VALUES ($1)`, sku)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgsql.UniqueViolation {
			status := http.StatusUnprocessableEntity
			fmt.Sscan(r.URL.Query().Get("conflict"), &status)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Only-First", "yes")
			w.WriteHeader(status)
			// The time makes each execution's body different, so a replay shows.
			fmt.Fprintf(w, `{"error":"sku %s exists","at":%q}`, sku, time.Now().Format(time.RFC3339Nano))
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *skuServer) post(t *testing.T, target, key string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+target, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := s.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	return reply{status: resp.StatusCode, header: resp.Header, body: readAll(t, resp)}
}

// A handler whose statement failed (a unique violation) and who answers it with a
// definitive 4xx has that answer stored and replayed, as the ledger stores a definitive
// failure: its writes, which cannot commit, are rolled back; the record says failed. A
// success-looking answer after a failed statement is refused with a 500 problem and
// leaves the key free; a 409 is not stored and leaves it free too. Every exec mode, on
// fresh connections, and checked from a connection of its own.
func TestMiddleware_AnswerAfterFailedStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := ledger.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE skus (sku text PRIMARY KEY); CREATE TABLE audit (what text NOT NULL);
		INSERT INTO skus VALUES ('taken')`)
	require.NoError(t, err)

	pgtest.EachExecMode(t, schema, func(t *testing.T, pool *pgxpool.Pool) {
		s := newSKUServer(t, pool, schema)
		check, err := pgx.Connect(ctx, pgtest.URL(t))
		require.NoError(t, err)
		defer check.Close(ctx)
		records := pgx.Identifier{schema, "idempotency_records"}.Sanitize()
		state := func(key string) string {
			var st string
			err := check.QueryRow(ctx, `SELECT state FROM `+records+` WHERE key = $1`, key).Scan(&st)
			if errors.Is(err, pgx.ErrNoRows) {
				return "none"
			}
			require.NoError(t, err)
			return st
		}
		audited := func() int {
			var n int
			require.NoError(t, check.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "audit"}.Sanitize()+
				` WHERE what = 'tried taken'`).Scan(&n))
			return n
		}
		key := func(name string) string { return `"` + name + "-" + strings.ReplaceAll(t.Name(), "/", "-") + `"` }

		// The first request on these connections takes the failure path.
		first := s.post(t, "/skus/taken", key("k422"))
		require.Equal(t, http.StatusUnprocessableEntity, first.status, string(first.body))
		require.Contains(t, string(first.body), "sku taken exists")
		require.Equal(t, "yes", first.header.Get("X-Only-First"))
		require.Empty(t, first.header.Get("Idempotency-Replayed"))
		require.Equal(t, "failed", state(strings.Trim(key("k422"), `"`)))
		require.Zero(t, audited(), "the audit row could not commit and was rolled back")

		again := s.post(t, "/skus/taken", key("k422"))
		require.Equal(t, http.StatusUnprocessableEntity, again.status)
		require.Equal(t, "true", again.header.Get("Idempotency-Replayed"))
		require.Equal(t, first.body, again.body, "byte-equal")
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Empty(t, again.header.Get("X-Only-First"), "only allow-listed headers are replayed")
		require.Equal(t, int64(1), s.calls.Load())

		ok := s.post(t, "/skus/taken?conflict=201", key("k201"))
		require.Equal(t, http.StatusInternalServerError, ok.status, "a success whose writes could not commit must not reach the client")
		require.Equal(t, idempotency.ProblemTxAborted, problemType(t, ok))
		require.Equal(t, "none", state(strings.Trim(key("k201"), `"`)))

		conflict := s.post(t, "/skus/taken?conflict=409", key("k409"))
		require.Equal(t, http.StatusConflict, conflict.status)
		require.Contains(t, string(conflict.body), "sku taken exists")
		require.Equal(t, "none", state(strings.Trim(key("k409"), `"`)), "409 is not stored: the key is free")
		require.Zero(t, audited())
		require.Equal(t, int64(3), s.calls.Load())
	})
}

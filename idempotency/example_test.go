package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/ledger"
)

// Guard a POST handler: the handler writes through the ledger's transaction, and a
// retried request gets the first response back, marked as a replay.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_payments (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)
	l, _ := ledger.New(pool, nil)

	guard, err := idempotency.New(&idempotency.Config{
		Ledger:     l,
		TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Client-ID"), nil },
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO example_payments (amount) VALUES (4200) RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"paid"}`)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	key := `"` + uuid.NewString() + `"`
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":4200}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Client-ID", "client-7")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotency-Replayed") == "true")
	}
	// Output:
	// 201 {"status":"paid"} replayed: false
	// 201 {"status":"paid"} replayed: true
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/ledger"
)

const httpSchema = "oncekit_bench_http"

// httpBench serves the same handler with and without the Idempotency-Key middleware
// and compares request latencies from one client.
type httpBench struct {
	url         string
	rounds      int
	opsPerRound int // a burst of one scenario, per round
}

func (b httpBench) run(ctx context.Context, out io.Writer) error {
	emit := func(name string, v float64) { fmt.Fprintf(out, "metric %s %.4g\n", name, v) }
	pool, err := freshSchema(ctx, b.url, httpSchema, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := ledger.New(pool, &ledger.Config{Schema: httpSchema})
	if err != nil {
		return err
	}
	mw, err := idempotency.New(&idempotency.Config{Ledger: l, TenantFunc: idempotency.FixedTenant("bench")})
	if err != nil {
		return err
	}
	respond := func(w http.ResponseWriter, id int64) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /bare", func(w http.ResponseWriter, r *http.Request) {
		var id int64
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			return tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ('bench') RETURNING id`).Scan(&id)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		respond(w, id)
	})
	mux.Handle("POST /orders", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.Tx(r)
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ('bench') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		respond(w, id)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := srv.Client()
	body := []byte(`{"item":"bench"}`)
	post := func(path, key string, want int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", `"`+key+`"`)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("%s: status %d", path, resp.StatusCode)
		}
		return nil
	}
	replayKeys := make([]string, 100)
	for i := range replayKeys {
		replayKeys[i] = uuid.NewString()
		if err := post("/orders", replayKeys[i], http.StatusCreated); err != nil {
			return err
		}
	}
	lat, err := interleave(ctx, b.rounds, b.opsPerRound, 1, []scenario{
		{"bare", func(context.Context, int) error { return post("/bare", "", http.StatusCreated) }},
		{"first", func(context.Context, int) error { return post("/orders", uuid.NewString(), http.StatusCreated) }},
		{"replay", func(_ context.Context, i int) error {
			return post("/orders", replayKeys[i%len(replayKeys)], http.StatusCreated)
		}},
	})
	if err != nil {
		return err
	}
	bare, first, replay := lat["bare"], lat["first"], lat["replay"]
	emit("http.bare_us", bare)
	emit("http.first_us", first)
	emit("http.replay_us", replay)
	emit("http.first_vs_bare", first/bare)
	emit("http.replay_vs_first", replay/first)
	return nil
}

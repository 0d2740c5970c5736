package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/devenv"
)

// The simulated provider charges once per Idempotency-Key, with DoStatement (a single
// PostgreSQL) and with Do (Citus): a retry after a lost answer and concurrent duplicates
// get the first charge's bytes, the same key with another body is refused, and a request
// without the header always charges.
func TestProvider_ChargesOncePerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Close() })
	pool, err := setupDatabase(ctx, env.DatabaseURL, []string{defaultShop})
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	for _, tc := range []struct {
		name  string
		citus bool
	}{{"DoStatement", false}, {"Do as on Citus", true}} {
		t.Run(tc.name, func(t *testing.T) {
			url, stop, err := startProvider(pool, tc.citus)
			require.NoError(t, err)
			t.Cleanup(stop)
			merchant := "merchant-" + tc.name
			post := func(key string, req chargeRequest) (int, []byte, error) {
				body, err := json.Marshal(req)
				require.NoError(t, err)
				r, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", bytes.NewReader(body))
				require.NoError(t, err)
				r.Header.Set("X-Merchant", merchant)
				if key != "" {
					r.Header.Set("Idempotency-Key", key)
				}
				resp, err := http.DefaultClient.Do(r)
				if err != nil {
					return 0, nil, err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return resp.StatusCode, b, err
			}

			// The first answer is lost after the charge committed; the retry replays it.
			_, _, err = post("charge-1", chargeRequest{OrderID: "o-1", Amount: 100, LoseFirstResponse: true})
			require.Error(t, err, "the provider drops the first answer")
			code, first, err := post("charge-1", chargeRequest{OrderID: "o-1", Amount: 100, LoseFirstResponse: true})
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, "%s", first)
			var c chargeResponse
			require.NoError(t, json.Unmarshal(first, &c))
			require.Equal(t, int64(100), c.Amount)
			require.NotZero(t, c.ChargeID)
			code, again, err := post("charge-1", chargeRequest{OrderID: "o-1", Amount: 100, LoseFirstResponse: true})
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, string(first), string(again), "a replay answers with the same bytes")

			code, _, err = post("charge-1", chargeRequest{OrderID: "o-1", Amount: 999})
			require.NoError(t, err)
			require.Equal(t, http.StatusUnprocessableEntity, code, "the same key with another body is refused")

			// Concurrent duplicates: one charge, the others replay it or hear it is in progress.
			var wg sync.WaitGroup
			var mu sync.Mutex
			bodies := map[string]int{}
			for range 20 {
				wg.Go(func() {
					code, b, err := post("charge-2", chargeRequest{OrderID: "o-2", Amount: 250})
					if err != nil {
						t.Error(err)
						return
					}
					if code != http.StatusOK && code != http.StatusConflict {
						t.Errorf("a duplicate heard %d: %s", code, b)
						return
					}
					if code == http.StatusOK {
						mu.Lock()
						bodies[string(b)]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			require.Len(t, bodies, 1, "every duplicate that succeeded got the one charge's bytes: %v", bodies)

			// Without the header every request charges.
			for range 2 {
				code, b, err := post("", chargeRequest{OrderID: "o-3", Amount: 5})
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, code, "%s", b)
			}

			counts := map[string]int{}
			rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM provider_charges WHERE merchant = $1 GROUP BY order_id`, merchant)
			require.NoError(t, err)
			for rows.Next() {
				var order string
				var n int
				require.NoError(t, rows.Scan(&order, &n))
				counts[order] = n
			}
			require.NoError(t, rows.Err())
			require.Equal(t, map[string]int{"o-1": 1, "o-2": 1, "o-3": 2}, counts)
		})
	}
}

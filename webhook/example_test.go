package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/webhook"
)

// A GitHub webhook receiver: the signature is checked before anything else, and a
// redelivery of the same delivery ID is answered without running the handler again.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool, ""); err != nil {
		panic(err)
	}
	l, err := ledger.New(pool, nil)
	if err != nil {
		panic(err)
	}
	const secret = "example-webhook-secret"
	handled := 0
	h, err := webhook.New(ctx, &webhook.Config{Ledger: l, Source: "github", Verifier: webhook.GitHub([]byte(secret)),
		Handle: func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
			handled++ // write through tx: it commits with the delivery's record
			return nil
		}})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	body := []byte(`{"action":"opened","issue":{"number":1}}`)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	deliver := func(signature string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958-example")
		req.Header.Set("X-GitHub-Event", "issues")
		req.Header.Set("X-Hub-Signature-256", signature)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	good := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	fmt.Println("forged:", deliver("sha256="+hex.EncodeToString(make([]byte, 32))))
	fmt.Println("first:", deliver(good))
	fmt.Println("redelivered:", deliver(good))
	fmt.Println("handled:", handled)
	// Output:
	// forged: 401
	// first: 200
	// redelivered: 200
	// handled: 1
}

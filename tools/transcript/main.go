// Command transcript produces the README's transcript of the oncekit command: it starts
// a throwaway PostgreSQL, records a few intents (one claim left stuck), builds the command
// and runs it.
//
//	go run ./tools/transcript
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/devenv"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/migrate"
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	ctx := context.Background()
	env, err := devenv.Start(ctx, &devenv.Config{NoTemporal: true})
	must(err)
	defer env.Close()
	pool, err := pgxpool.New(ctx, env.DatabaseURL)
	must(err)
	_, err = migrate.Up(ctx, pool, "")
	must(err)
	l, err := ledger.New(pool, nil)
	must(err)
	in := func(tenant, op, key string) ledger.Intent {
		fp, _ := keys.FingerprintJSON(key)
		return ledger.Intent{Scope: keys.Scope{Tenant: tenant, Operation: op}, Key: keys.Key(key), Fingerprint: fp}
	}
	for i := range 3 {
		_, err = l.Do(ctx, in("shop", "orders.create", fmt.Sprintf("order-%d", i)), func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{Code: 201, Body: []byte(fmt.Sprintf(`{"order":"order-%d","status":"created"}`, i))}, nil
		}, nil)
		must(err)
	}
	_, err = l.Claim(ctx, in("shop", "payments.charge", "charge-7"), &ledger.ClaimOpts{Lease: time.Second})
	must(err)
	time.Sleep(1100 * time.Millisecond)
	bin := filepath.Join(os.TempDir(), "oncekit-transcript")
	must(exec.Command("go", "build", "-o", bin, "./cmd/oncekit").Run())
	defer os.Remove(bin)
	for _, args := range [][]string{
		{"status"},
		{"list", "--stuck"},
		{"inspect", "shop", "payments.charge", "charge-7"},
		{"release", "shop", "payments.charge", "charge-7"},
		{"release", "shop", "payments.charge", "charge-7", "--yes"},
	} {
		fmt.Printf("$ oncekit %s\n", strings.Join(args, " "))
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+env.DatabaseURL)
		out, err := cmd.CombinedOutput()
		fmt.Print(string(out))
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			fmt.Printf("$ echo $?\n%d\n", ee.ExitCode())
		}
		fmt.Println()
	}
}

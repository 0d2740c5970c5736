package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The quick start builds, and runs as the README says against a fresh database and a
// Temporal dev server: the first order is charged, the second compensated; run again,
// it prints the same and writes nothing more.
func TestQuickstart(t *testing.T) {
	srv := testsuite.StartDevServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A database of its own: the program uses the default schemas.
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close(context.Background())) })
	db := "quickstart_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	_, err = conn.Exec(ctx, "CREATE DATABASE "+db)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := conn.Exec(context.Background(), "DROP DATABASE "+db+" WITH (FORCE)")
		require.NoError(t, err)
	})
	dbURL := withDatabase(t, pgtest.URL(t), db)

	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	want := readmeOutput(t)
	db2, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer db2.Close(context.Background())
	records := -1 // the ledger's records after the first run
	for run := range 2 {
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "TEMPORAL_ADDRESS="+srv.TemporalAddress, "TEMPORAL_NAMESPACE="+srv.Namespace)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "run %d: %s", run+1, stderr.String())
		t.Logf("run %d, stderr:\n%s", run+1, stderr.String())
		require.Equal(t, want, string(out), "run %d", run+1)
		// order-1 reserved and charged once; order-2's reservation released, never charged.
		counts := map[string]int{}
		for name, q := range map[string]string{
			"order-1 reserved": `SELECT count(*) FROM reservations WHERE order_id = 'order-1'`,
			"order-2 reserved": `SELECT count(*) FROM reservations WHERE order_id = 'order-2'`,
			"order-1 charged":  `SELECT count(*) FROM payments WHERE order_id = 'order-1'`,
			"order-2 charged":  `SELECT count(*) FROM payments WHERE order_id = 'order-2'`,
		} {
			var n int
			require.NoError(t, db2.QueryRow(ctx, q).Scan(&n))
			counts[name] = n
		}
		require.Equal(t, map[string]int{"order-1 reserved": 1, "order-2 reserved": 0, "order-1 charged": 1, "order-2 charged": 0}, counts, "run %d", run+1)
		// The second run replays each saga's outcome and records nothing new.
		var n int
		require.NoError(t, db2.QueryRow(ctx, `SELECT count(*) FROM oncekit.idempotency_records`).Scan(&n))
		if records < 0 {
			require.Positive(t, n)
			records = n
		}
		require.Equal(t, records, n, "run %d recorded more", run+1)
	}
}

// withDatabase returns the connection string s naming database db instead.
func withDatabase(t *testing.T, s, db string) string {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return s + " dbname=" + db // a later keyword wins
	}
	u, err := url.Parse(s)
	require.NoError(t, err)
	u.Path = "/" + db
	return u.String()
}

// readmeOutput returns the output the README shows for the quick start: the lines after
// its "$ ... go run -C samples ./quickstart" line, up to the end of that block.
func readmeOutput(t *testing.T) string {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	var out strings.Builder
	in := false
	for line := range strings.Lines(string(readme)) {
		switch {
		case strings.HasPrefix(line, "$ ") && strings.HasSuffix(line, " go run -C samples ./quickstart\n"):
			in = true
		case in && line == "```\n":
			return out.String()
		case in:
			out.WriteString(line)
		}
	}
	t.Fatal("README.md shows no output of go run -C samples ./quickstart")
	return ""
}

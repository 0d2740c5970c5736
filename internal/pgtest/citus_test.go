package pgtest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
)

// logWriter writes a build's output to the test's log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// TestStartCitus builds Citus when it is not cached yet and starts a coordinator with
// two workers; `make test-citus` runs it first, so that its skip says how to get a
// tarball.
func TestStartCitus(t *testing.T) {
	t.Parallel()
	if os.Getenv(pgtest.CitusEnv) != "1" {
		t.Skip("set " + pgtest.CitusEnv + "=1 (make test-citus) to build and start Citus")
	}
	if _, err := pgtest.CitusTarball(); errors.Is(err, pgtest.ErrNoCitus) {
		t.Skip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := pgtest.StartCitus(ctx, &pgtest.CitusOpts{Progress: logWriter{t}})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	conn, err := pgx.Connect(ctx, c.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var workers int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers))
	require.Equal(t, pgtest.CitusWorkersDefault, workers)
	require.Len(t, c.Workers, pgtest.CitusWorkersDefault)
}

package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/keys"
)

// A record holds the time its process gave, but expires a retention after the later of
// that time and the database's clock: a process whose clock is behind cannot make it
// expire early, and one whose clock is ahead keeps it longer.
func TestRecordExpiry_ProcessClockAhead_Behind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.NewSchema(t)
	_, err := Migrate(ctx, pool, schema)
	require.NoError(t, err)
	l, err := New(pool, &Config{Schema: schema})
	require.NoError(t, err)
	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	for _, c := range []struct {
		key     string
		skew    time.Duration
		failed  bool
		expires time.Duration // after the database's now
	}{
		{"behind", -2 * time.Hour, false, time.Hour},
		{"behind-failed", -2 * time.Hour, true, time.Hour},
		{"ahead", 2 * time.Hour, false, 3 * time.Hour},
		{"ahead-failed", 2 * time.Hour, true, 3 * time.Hour},
	} {
		in := Intent{Scope: keys.Scope{Tenant: "acme", Operation: "orders.create"}, Key: keys.Key(c.key), Fingerprint: "fp"}
		at := time.Now().Add(c.skew).Truncate(time.Microsecond)
		b, args := l.completedBatch(in, time.Hour, [4]any{}, "COMMIT")
		setCompleted(args, Response{Code: 201}, at, nil)
		sql := b.QueuedQueries[0].SQL
		if c.failed {
			sql, args = l.q.insertFailed, l.failedArgs(in, &DefinitiveError{Code: "no", Message: "no"}, time.Hour, at, nil, [4]any{})
		}
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, c.key)
		rec, err := l.Get(ctx, in.Scope, in.Key)
		require.NoError(t, err, c.key)
		require.True(t, rec.CreatedAt.Equal(at), "%s: created %s, want %s", c.key, rec.CreatedAt, at)
		require.False(t, rec.Expired, c.key)
		require.WithinDuration(t, dbNow.Add(c.expires), rec.ExpiresAt, time.Minute, c.key)
	}
}

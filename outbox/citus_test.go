package outbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/outbox"
)

// remoteCommands is a pool whose sessions log the commands Citus sends to workers,
// as notices it collects.
type remoteCommands struct {
	mu   sync.Mutex
	sent []string
}

func (r *remoteCommands) pool(t *testing.T, schema string) *pgxpool.Pool {
	return pgtest.Pool(t, schema, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["citus.log_remote_commands"] = "on"
		c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.sent = append(r.sent, n.Message)
		}
	})
}

// prepared reports whether a PREPARE TRANSACTION was sent since the last call.
func (r *remoteCommands) prepared() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := false
	for _, m := range r.sent {
		found = found || strings.Contains(m, "PREPARE TRANSACTION")
	}
	r.sent = nil
	return found
}

// On Citus the outbox's and the inbox's tables stay on the coordinator, and an event
// enqueued, or a message recorded, with a write to a tenant's shard on a worker commits
// with it, in two-phase commit, or rolls back with it.
func TestCitus_MessagesCommitWithTheTenantsWrite(t *testing.T) {
	t.Parallel()
	pgtest.CitusCluster(t)
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE entries (tenant text NOT NULL, id bigint NOT NULL, amount bigint NOT NULL, PRIMARY KEY (tenant, id));
		SELECT create_distributed_table('entries', 'tenant')`)
	require.NoError(t, err)
	var rc remoteCommands
	pool := rc.pool(t, b.schema)
	out, err := outbox.New(pool, &outbox.Config{Schema: b.schema})
	require.NoError(t, err)
	in, err := inbox.New(pool, &inbox.Config{Schema: b.schema})
	require.NoError(t, err)
	entry := func(ctx context.Context, tx pgx.Tx, id int) error {
		_, err := tx.Exec(ctx, `INSERT INTO entries (tenant, id, amount) VALUES ('acme', $1, 10)`, id)
		return err
	}
	count := func(sql string, args ...any) int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}

	t.Run("Enqueue", func(t *testing.T) {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := entry(ctx, tx, 1); err != nil {
				return err
			}
			_, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "entries", Payload: []byte(`{"id":1}`)})
			return err
		}))
		require.True(t, rc.prepared(), "the event and the entry commit with two-phase commit")
		require.Equal(t, 1, count(`SELECT count(*) FROM entries WHERE tenant = 'acme' AND id = 1`))
		require.Equal(t, 1, count(`SELECT count(*) FROM outbox_events WHERE topic = 'entries'`))

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, entry(ctx, tx, 2))
		_, err = out.Enqueue(ctx, tx, outbox.Event{Topic: "entries", Payload: []byte(`{"id":2}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, 0, count(`SELECT count(*) FROM entries WHERE tenant = 'acme' AND id = 2`))
		require.Equal(t, 1, count(`SELECT count(*) FROM outbox_events WHERE topic = 'entries'`))
	})

	t.Run("Handle", func(t *testing.T) {
		res, err := in.Handle(ctx, "ledger", "m-3", func(ctx context.Context, tx pgx.Tx) error { return entry(ctx, tx, 3) })
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		require.True(t, rc.prepared(), "the message's record and the entry commit with two-phase commit")
		res, err = in.Handle(ctx, "ledger", "m-3", func(ctx context.Context, tx pgx.Tx) error { return entry(ctx, tx, 3) })
		require.NoError(t, err)
		require.True(t, res.Duplicate)
		require.Equal(t, 1, count(`SELECT count(*) FROM entries WHERE tenant = 'acme' AND id = 3`))
		require.Equal(t, 1, count(`SELECT count(*) FROM inbox_messages WHERE message_id = 'm-3'`))
	})
}

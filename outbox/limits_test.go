package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/migrate"
	"github.com/oncekit/oncekit/outbox"
)

// A schema name long enough that "oncekit_outbox." and the name exceed PostgreSQL's
// 63-byte channel names still enqueues, notifies and dispatches.
func TestOutbox_LongSchemaName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewSchema(t)
	schema := "s_" + strings.Repeat("x", 58) // 60 bytes: a valid identifier
	_, err := migrate.Up(ctx, pool, schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	out, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := out.Enqueue(ctx, tx, outbox.Event{Topic: "t", Payload: []byte(`{}`)})
		return err
	}))
	var published int
	d, err := outbox.NewDispatcher(out, outbox.PublisherFunc(func(context.Context, outbox.Event) error {
		published++
		return nil
	}), nil)
	require.NoError(t, err)
	n, err := d.DispatchOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, published)
}

// Dead refuses a limit that is not positive with a clear error, not a raw PostgreSQL one.
func TestOutbox_DeadLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, limit := range []int{0, -1} {
		_, err := b.out.Dead(context.Background(), limit)
		require.Error(t, err)
		require.Contains(t, err.Error(), "limit")
		require.NotContains(t, err.Error(), "SQLSTATE")
	}
}

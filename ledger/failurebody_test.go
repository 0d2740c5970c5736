package ledger_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/ledger"
)

// A definitive failure with a response of its own (an HTTP error's status and body) is
// stored with it and replayed byte for byte, from Do in every mode and from Fail.
func TestDefinitiveError_ResponseStoredAndReplayed(t *testing.T) {
	t.Parallel()
	body := []byte("{\"error\":\"card declined\"}\x00\xff")
	failure := func() *ledger.DefinitiveError {
		return &ledger.DefinitiveError{Code: "http_402", Message: "Payment Required",
			Response: &ledger.Response{Code: 402, Body: bytes.Clone(body)}}
	}
	eachMode(t, func(t *testing.T, mode ledger.Mode) {
		l, _ := setup(t, nil)
		ctx := context.Background()
		in := intent(t, "acme", "declined", order{Item: "tv"})
		fn := func(context.Context, pgx.Tx) (ledger.Response, error) { return ledger.Response{}, failure() }
		for i, replayed := range []bool{false, true} {
			_, err := l.Do(ctx, in, fn, &ledger.DoOpts{Mode: mode})
			var derr *ledger.DefinitiveError
			require.ErrorAs(t, err, &derr, "call %d", i)
			require.Equal(t, replayed, derr.Replayed)
			require.NotNil(t, derr.Response)
			require.Equal(t, 402, derr.Response.Code)
			require.Equal(t, body, derr.Response.Body)
		}
	})
	t.Run("Fail", func(t *testing.T) {
		t.Parallel()
		l, _ := setup(t, nil)
		ctx := context.Background()
		in := intent(t, "acme", "charge-declined", order{Item: "tv"})
		claimed, err := l.Claim(ctx, in, nil)
		require.NoError(t, err)
		require.NoError(t, l.Fail(ctx, claimed.Lease, failure()))
		_, err = l.Claim(ctx, in, nil)
		var derr *ledger.DefinitiveError
		require.ErrorAs(t, err, &derr)
		require.True(t, derr.Replayed)
		require.Equal(t, &ledger.Response{Code: 402, Body: body}, derr.Response)
	})
	t.Run("WithoutResponse", func(t *testing.T) {
		t.Parallel()
		l, _ := setup(t, nil)
		in := intent(t, "acme", "plain", order{Item: "tv"})
		fn := func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{}, ledger.Definitive("out_of_stock", "")
		}
		for range 2 {
			_, err := l.Do(context.Background(), in, fn, nil)
			var derr *ledger.DefinitiveError
			require.ErrorAs(t, err, &derr)
			require.Nil(t, derr.Response)
		}
	})
	t.Run("BodyTooLarge", func(t *testing.T) {
		t.Parallel()
		l, b := setup(t, &ledger.Config{MaxBodyBytes: 8})
		in := intent(t, "acme", "too-large", order{Item: "tv"})
		_, err := l.Do(context.Background(), in, func(context.Context, pgx.Tx) (ledger.Response, error) {
			return ledger.Response{}, failure()
		}, nil)
		require.ErrorIs(t, err, ledger.ErrBodyTooLarge)
		require.Equal(t, 0, countRecords(t, b.pool, b.schema), "nothing stored")
	})
}

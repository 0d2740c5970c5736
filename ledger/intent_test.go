package ledger_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// An intent without a fingerprint is refused before anything runs, with an error that
// names the field and says how to make one; a malformed one names the field too. Both
// stay a *keys.ValidationError wrapping keys.ErrInvalidFingerprint.
func TestIntent_FingerprintRequired(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, nil)
	ctx := context.Background()
	scope := keys.Scope{Tenant: "acme", Operation: "orders.create"}
	ran := false
	fn := func(context.Context, pgx.Tx) (ledger.Response, error) { ran = true; return ledger.Response{}, nil }

	for _, tc := range []struct {
		name string
		fp   keys.Fingerprint
		want []string
	}{
		{"Empty", "", []string{"Intent.Fingerprint", "empty", "keys.FingerprintJSON", "keys.FingerprintBytes"}},
		{"Malformed", "sha1:abc", []string{"Intent.Fingerprint", `"sha1:abc"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := ledger.Intent{Scope: scope, Key: "order-1", Fingerprint: tc.fp}
			_, doErr := l.Do(ctx, in, fn, nil)
			_, claimErr := l.Claim(ctx, in, nil)
			for _, err := range []error{doErr, claimErr} {
				require.ErrorIs(t, err, keys.ErrInvalidFingerprint)
				var ve *keys.ValidationError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, "fingerprint", ve.Field)
				for _, w := range tc.want {
					require.Contains(t, err.Error(), w)
				}
			}
			require.False(t, ran)
			if tc.name == "Empty" {
				// The ledger guide quotes this error: it must be the one Do returns.
				guide, err := os.ReadFile(filepath.Join("..", "docs", "ledger.md"))
				require.NoError(t, err)
				require.Contains(t, string(guide), "\n"+doErr.Error()+"\n", "docs/ledger.md quotes another error")
			}
		})
	}
}

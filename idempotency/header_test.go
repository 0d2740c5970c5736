package idempotency_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`"abc"`:       "abc",
		`  "a b c"  `: "a b c",
		`"a\"b\\c"`:   `a"b\c`,
		`"k";ttl=60`:  "k",
		`token-123`:   "token-123",
		`tok;param`:   "tok",
	} {
		got, err := idempotency.ParseKey([]string{in})
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for in, want := range map[string]error{
		``:                idempotency.ErrKeyMissing,
		`""`:              idempotency.ErrKeyInvalid,
		`"abc`:            idempotency.ErrKeyInvalid,
		`"a\x"`:           idempotency.ErrKeyInvalid,
		`"a" "b"`:         idempotency.ErrKeyInvalid,
		`"a", "b"`:        idempotency.ErrKeyMultiple,
		`a, b`:            idempotency.ErrKeyMultiple,
		"\"a\tb\"":        idempotency.ErrKeyInvalid,
		`a b`:             idempotency.ErrKeyInvalid,
		"\"caf\xc3\xa9\"": idempotency.ErrKeyInvalid,
	} {
		_, err := idempotency.ParseKey([]string{in})
		require.ErrorIs(t, err, want, "%q", in)
	}
	_, err := idempotency.ParseKey(nil)
	require.ErrorIs(t, err, idempotency.ErrKeyMissing)
	_, err = idempotency.ParseKey([]string{`"a"`, `"b"`})
	require.ErrorIs(t, err, idempotency.ErrKeyMultiple)
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `tok`, `"a\"b"`, `"a", "b"`, `"x";p=1`, "\"\x00\"", `""`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := idempotency.ParseKey([]string{in})
		if err != nil {
			return
		}
		if key == "" {
			t.Fatalf("empty key from %q", in)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("key %q from %q has byte %#x", key, in, key[i])
			}
		}
		// Serialising the key as a Structured Field string parses back to it.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		back, err := idempotency.ParseKey([]string{quoted})
		if err != nil || back != key {
			t.Fatalf("%q -> %q -> %s -> %q, %v", in, key, strconv.Quote(quoted), back, err)
		}
	})
}

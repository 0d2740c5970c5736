package keys_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/keys"
)

func TestKey_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		key  string
		err  error
	}{
		{"Ok", "order-42/charge", nil},
		{"SpaceAndQuotes", `a 'b' "c"`, nil},
		{"MaxLen", strings.Repeat("k", keys.MaxLenDefault), nil},
		{"Empty", "", keys.ErrEmpty},
		{"TooLong", strings.Repeat("k", keys.MaxLenDefault+1), keys.ErrTooLong},
		{"Control", "a\nb", keys.ErrInvalidByte},
		{"NonASCII", "café", keys.ErrInvalidByte},
		{"Del", "a\x7f", keys.ErrInvalidByte},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := keys.New(tc.key)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			var ve *keys.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, "key", ve.Field)
			require.NotEmpty(t, ve.Error())
		})
	}
}

func TestValidationError_SaysWhere(t *testing.T) {
	t.Parallel()
	_, err := keys.New("abc\x01def")
	var ve *keys.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, 3, ve.Offset)
	require.Equal(t, byte(1), ve.Byte)
	require.Contains(t, err.Error(), "offset 3")

	err = keys.Key(strings.Repeat("x", 300)).Validate()
	require.ErrorAs(t, err, &ve)
	require.Equal(t, 300, ve.Len)
	require.Equal(t, keys.MaxLenDefault, ve.Limit)
	require.Contains(t, err.Error(), "300 bytes")
}

func TestScope_Validate(t *testing.T) {
	t.Parallel()
	require.NoError(t, keys.Scope{Tenant: "acme", Operation: "payments.charge"}.Validate())
	err := keys.Scope{Operation: "x"}.Validate()
	require.ErrorIs(t, err, keys.ErrEmpty)
	require.Contains(t, err.Error(), "tenant")
	err = keys.Scope{Tenant: "acme"}.Validate()
	require.ErrorIs(t, err, keys.ErrEmpty)
	require.Contains(t, err.Error(), "operation")
	require.ErrorIs(t, keys.Scope{Tenant: "a", Operation: strings.Repeat("o", 129)}.Validate(), keys.ErrTooLong)
}

func TestStrategies_AreInjectiveAndBounded(t *testing.T) {
	t.Parallel()
	require.NotEqual(t, keys.Run("a:b", "c"), keys.Run("a", "b:c"))
	require.NotEqual(t, keys.Run("r", "1"), keys.Workflow("r", "1"))
	require.NotEqual(t, keys.Run("r", "1"), keys.Local("r", "1"))
	require.Equal(t, keys.Run("run", "5"), keys.Run("run", "5"))
	require.Equal(t, keys.Key("v1:run:run-id:5"), keys.Run("run-id", "5"))
	require.Equal(t, keys.Key("v1:wf:order%3A42:5"), keys.Workflow("order:42", "5"))

	long := strings.Repeat("w", 1000)
	k1, k2 := keys.Workflow(long, "1"), keys.Workflow(long, "2")
	require.Len(t, string(k1), keys.MaxLenDefault)
	require.NoError(t, k1.Validate())
	require.NotEqual(t, k1, k2)
	require.True(t, strings.HasPrefix(string(k1), "v1:wf:www"), "a long key keeps a readable prefix")

	b, err := keys.Business("order-42", "charge")
	require.NoError(t, err)
	require.Equal(t, keys.Key("v1:biz:order-42:charge"), b)
	_, err = keys.Business()
	require.ErrorIs(t, err, keys.ErrEmpty)
	_, err = keys.Business("order-42", "")
	require.ErrorIs(t, err, keys.ErrEmpty)
}

func TestIdentity_Key(t *testing.T) {
	t.Parallel()
	id := keys.Identity{WorkflowID: "wf", RunID: "run", ActivityID: "7"}
	k, err := id.Key(keys.RunScoped)
	require.NoError(t, err)
	require.Equal(t, keys.Run("run", "7"), k)
	k, err = id.Key(keys.WorkflowScoped)
	require.NoError(t, err)
	require.Equal(t, keys.Workflow("wf", "7"), k)
	_, err = id.Key(keys.BusinessScoped)
	require.ErrorIs(t, err, keys.ErrBusinessStrategy)

	id.Local = true
	k, err = id.Key(keys.RunScoped)
	require.NoError(t, err)
	require.Equal(t, keys.Local("run", "7"), k)

	sa := keys.Identity{ActivityID: "provision-9", ActivityRunID: "arun"}
	k, err = sa.Key(keys.RunScoped)
	require.NoError(t, err)
	require.Equal(t, keys.Standalone("provision-9", "arun"), k)
	_, err = keys.Identity{}.Key(keys.RunScoped)
	require.ErrorIs(t, err, keys.ErrEmpty)
}

func TestDerive(t *testing.T) {
	t.Parallel()
	parent := keys.Run("run-1", "3")
	refund, err := keys.Derive(parent, "refund")
	require.NoError(t, err)
	again, err := keys.Derive(parent, "refund")
	require.NoError(t, err)
	require.Equal(t, refund, again, "deterministic")
	require.True(t, strings.HasPrefix(string(refund), "refund."))
	require.Len(t, string(refund), len("refund.")+32)
	require.NotContains(t, string(refund), "run-1", "opaque to the provider")

	charge, err := keys.Derive(parent, "stripe-charge")
	require.NoError(t, err)
	require.NotEqual(t, refund, charge)
	other, err := keys.Derive(keys.Run("run-2", "3"), "refund")
	require.NoError(t, err)
	require.NotEqual(t, refund, other)
	nested, err := keys.Derive(refund, "provider-refund")
	require.NoError(t, err)
	require.NoError(t, nested.Validate())

	a, err := keys.DeriveIn(keys.Scope{Tenant: "a", Operation: "pay"}, parent, "charge")
	require.NoError(t, err)
	b, err := keys.DeriveIn(keys.Scope{Tenant: "b", Operation: "pay"}, parent, "charge")
	require.NoError(t, err)
	require.NotEqual(t, a, b, "two tenants' equal keys never meet downstream")
	plain, err := keys.Derive(parent, "charge")
	require.NoError(t, err)
	require.NotEqual(t, a, plain)
	_, err = keys.DeriveIn(keys.Scope{}, parent, "charge")
	require.ErrorIs(t, err, keys.ErrEmpty)

	_, err = keys.Derive(parent, "")
	require.ErrorIs(t, err, keys.ErrEmpty)
	_, err = keys.Derive(parent, "has space")
	require.ErrorIs(t, err, keys.ErrInvalidByte)
	_, err = keys.Derive(parent, strings.Repeat("p", 65))
	require.ErrorIs(t, err, keys.ErrTooLong)
	_, err = keys.Derive("", "refund")
	require.ErrorIs(t, err, keys.ErrEmpty)
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	same := []string{
		`{"b":1,"a":[1,2,{"y":true,"x":null}]}`,
		"{ \"a\" : [ 1 , 2.0 , { \"x\" : null , \"y\" : true } ] ,\n \"b\" : 1e0 }",
		`{"a":[10e-1,0.2e1,{"x":null,"y":true}],"b":1.000}`,
	}
	want, err := keys.CanonicalJSON([]byte(same[0]))
	require.NoError(t, err)
	require.Equal(t, `{"a":[1,2,{"x":null,"y":true}],"b":1}`, string(want))
	for _, s := range same[1:] {
		got, err := keys.CanonicalJSON([]byte(s))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), s)
	}
	for _, bad := range []string{`{"a":1,"a":2}`, "\"\xff\"", `{"a":1} {}`, `{"a":`, ``, `[1,]`} {
		_, err := keys.CanonicalJSON([]byte(bad))
		require.ErrorIs(t, err, keys.ErrInvalidJSON, "%q", bad)
		var je *keys.JSONError
		require.ErrorAs(t, err, &je)
	}
}

func TestCanonicalJSON_Numbers(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"0": "0", "-0": "0", "0.000": "0", "1": "1", "1.50": "1.5e0", "-2.5e3": "-2500",
		"123456789012345678901234567890": "1.2345678901234567890123456789e29",
		"9007199254740993":               "9007199254740993", // beyond float64: kept exact
		"1e20":                           "100000000000000000000",
		"1e21":                           "1e21",
		"1E+22":                          "1e22",
		"0.001":                          "1e-3",
		"12.34":                          "1.234e1",
	} {
		got, err := keys.CanonicalJSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, want, string(got), in)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	type req struct {
		Amount int64  `json:"amount"`
		Card   string `json:"card"`
	}
	a, err := keys.FingerprintJSON(req{Amount: 100, Card: "tok_1"})
	require.NoError(t, err)
	b, err := keys.FingerprintJSON(map[string]any{"card": "tok_1", "amount": 100.0})
	require.NoError(t, err)
	require.Equal(t, a, b, "field order and number type do not matter")
	c, err := keys.FingerprintJSON(json.RawMessage(`{ "card":"tok_1", "amount": 1e2 }`))
	require.NoError(t, err)
	require.Equal(t, a, c)
	d, err := keys.FingerprintJSON(req{Amount: 101, Card: "tok_1"})
	require.NoError(t, err)
	require.NotEqual(t, a, d)
	require.NoError(t, a.Validate())
	require.True(t, strings.HasPrefix(string(a), "v1:"))

	raw := keys.FingerprintBytes([]byte(`{"amount":100,"card":"tok_1"}`))
	require.NoError(t, raw.Validate())
	require.NotEqual(t, a, raw, "bytes and JSON fingerprints live in separate domains")

	_, err = keys.FingerprintJSON(func() {})
	require.Error(t, err)
	require.ErrorIs(t, keys.Fingerprint("v1:xyz").Validate(), keys.ErrInvalidFingerprint)
	require.ErrorIs(t, keys.Fingerprint("").Validate(), keys.ErrInvalidFingerprint)
}

// Hostile nesting is refused at a fixed depth, cheaply, instead of growing the stack
// with the input.
func TestCanonicalJSON_Depth(t *testing.T) {
	t.Parallel()
	ok := strings.Repeat("[", keys.MaxJSONDepth) + strings.Repeat("]", keys.MaxJSONDepth)
	_, err := keys.CanonicalJSON([]byte(ok))
	require.NoError(t, err)

	for _, hostile := range [][]byte{
		[]byte(strings.Repeat("[", keys.MaxJSONDepth+1) + strings.Repeat("]", keys.MaxJSONDepth+1)),
		bytes.Repeat([]byte("["), 4<<20),
		bytes.Repeat([]byte(`{"a":`), 1<<20),
	} {
		_, err := keys.CanonicalJSON(hostile)
		require.ErrorIs(t, err, keys.ErrJSONTooDeep)
		require.ErrorIs(t, err, keys.ErrInvalidJSON)
		var je *keys.JSONError
		require.ErrorAs(t, err, &je)
		require.True(t, je.TooDeep)
		require.Less(t, len(err.Error()), 200, "the error does not echo the input")
	}
	_, err = keys.FingerprintJSON(json.RawMessage(bytes.Repeat([]byte("["), 1<<20)))
	require.ErrorIs(t, err, keys.ErrJSONTooDeep)
}

// Server-derived scope parts are always accepted: long or non-ASCII values map to a
// valid, distinct, fixed-size form.
func TestScopePart(t *testing.T) {
	t.Parallel()
	require.Equal(t, "acme", keys.ScopePart("acme"))
	require.Equal(t, "a%7Eb", keys.ScopePart("a%7Eb"), "valid values pass through, so they cannot collide with an escaped one")
	seen := map[string]string{}
	for _, s := range []string{"jürgen@müller.example", strings.Repeat("t", 137), "/orders/€/refund",
		"/" + strings.Repeat("p", 151), "a~b", "", "tab\there", strings.Repeat("é", 200)} {
		p := keys.ScopePart(s)
		require.NoError(t, keys.Scope{Tenant: p, Operation: p}.Validate(), "%q -> %q", s, p)
		require.LessOrEqual(t, len(p), keys.MaxScopeLen)
		require.Contains(t, p, "~")
		if prev, ok := seen[p]; ok {
			t.Fatalf("%q and %q map to %q", prev, s, p)
		}
		seen[p] = s
		require.Equal(t, p, keys.ScopePart(s), "deterministic")
	}
}

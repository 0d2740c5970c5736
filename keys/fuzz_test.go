package keys_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/keys"
)

func FuzzValidate(f *testing.F) {
	for _, s := range []string{"", "order-1", "a\x00b", "ü", string(bytes.Repeat([]byte{'a'}, 300))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := keys.Key(s).Validate()
		ok := len(s) > 0 && len(s) <= keys.MaxLenDefault
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				ok = false
			}
		}
		if ok != (err == nil) {
			t.Fatalf("Validate(%q) = %v, want ok=%v", s, err, ok)
		}
	})
}

func FuzzCompose(f *testing.F) {
	f.Add("wf:1", "run", "5")
	f.Add("", "\x00", "~%")
	f.Fuzz(func(t *testing.T, wf, run, act string) {
		for _, k := range []keys.Key{keys.Run(run, act), keys.Workflow(wf, act), keys.Local(run, act), keys.Standalone(act, run)} {
			if err := k.Validate(); err != nil {
				t.Fatalf("composed key %q invalid: %v", k, err)
			}
		}
		if a, b := keys.Run(run, act), keys.Run(run, act); a != b {
			t.Fatal("not deterministic")
		}
		// Injective on the split between the parts.
		if run+act != "" && keys.Run(run, act) == keys.Run(run+act, "") && act != "" {
			t.Fatalf("Run(%q,%q) collides with Run(%q,\"\")", run, act, run+act)
		}
	})
}

func FuzzDerive(f *testing.F) {
	f.Add("v1:run:abc:1", "refund")
	f.Add("x", "stripe-charge")
	f.Fuzz(func(t *testing.T, parent, purpose string) {
		k, err := keys.Derive(keys.Key(parent), purpose)
		if err != nil {
			return
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("derived key %q invalid: %v", k, err)
		}
		k2, _ := keys.Derive(keys.Key(parent), purpose)
		if k != k2 {
			t.Fatal("not deterministic")
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":2}`, `[1.0, 2e3, -0.5]`, `"x"`, `{"a":{"b":[null,true]}}`, `1E400`, `{"a":1,"a":1}`,
		strings.Repeat("[", 200), strings.Repeat(`{"a":`, 129) + "1" + strings.Repeat("}", 129),
		strings.Repeat("[", 128) + strings.Repeat("]", 128)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := keys.CanonicalJSON(in)
		if errors.Is(err, keys.ErrJSONTooDeep) {
			if depth(in) <= keys.MaxJSONDepth {
				t.Fatalf("refused as too deep at nesting %d: %q", depth(in), in)
			}
			return
		}
		if err != nil {
			return
		}
		if d := depth(c); d > keys.MaxJSONDepth {
			t.Fatalf("accepted nesting %d", d)
		}
		if !json.Valid(c) {
			t.Fatalf("canonical form %q of %q is not JSON", c, in)
		}
		c2, err := keys.CanonicalJSON(c)
		if err != nil || !bytes.Equal(c, c2) {
			t.Fatalf("not idempotent: %q -> %q (%v)", c, c2, err)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, in, "", "  "); err == nil {
			c3, err := keys.CanonicalJSON(indented.Bytes())
			if err != nil || !bytes.Equal(c, c3) {
				t.Fatalf("white space changed the canonical form: %q vs %q (%v)", c, c3, err)
			}
		}
	})
}

// depth is the deepest nesting of brackets outside strings in a JSON text.
func depth(b []byte) int {
	d, deepest, inString, escaped := 0, 0, false, false
	for _, c := range b {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && (c == '[' || c == '{'):
			d++
			deepest = max(deepest, d)
		case !inString && (c == ']' || c == '}'):
			d--
		}
	}
	return deepest
}

func FuzzScopePart(f *testing.F) {
	for _, s := range []string{"acme", "jürgen@müller.example", "a~b", "", strings.Repeat("x", 300), "/caf\xc3\xa9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := keys.ScopePart(s)
		if err := (keys.Scope{Tenant: p, Operation: p}).Validate(); err != nil {
			t.Fatalf("%q -> %q: %v", s, p, err)
		}
		if keys.ScopePart(s) != p {
			t.Fatal("not deterministic")
		}
		if (p == s) == strings.Contains(p, "~") {
			t.Fatalf("%q -> %q: only a transformed value may contain '~'", s, p)
		}
	})
}

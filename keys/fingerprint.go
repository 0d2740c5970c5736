package keys

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// Fingerprint identifies a request payload: "v1:" followed by 64 hex digits of SHA-256.
// The version prefix lets the encoding evolve; fingerprints of different versions never
// compare equal.
type Fingerprint string

const fingerprintPrefix = "v1:"

// domain separators keep a JSON fingerprint and a bytes fingerprint of the same bytes apart.
const (
	domainJSON  = "oncekit.fingerprint.json.v1\x00"
	domainBytes = "oncekit.fingerprint.bytes.v1\x00"
)

// String returns the fingerprint as a string.
func (f Fingerprint) String() string { return string(f) }

// Validate reports whether f is a well-formed fingerprint.
func (f Fingerprint) Validate() error {
	s := string(f)
	if !strings.HasPrefix(s, fingerprintPrefix) || len(s) != len(fingerprintPrefix)+64 {
		return invalid("fingerprint", s, -1, 0, ErrInvalidFingerprint)
	}
	for i := len(fingerprintPrefix); i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return invalid("fingerprint", s, i, 0, ErrInvalidFingerprint)
		}
	}
	return nil
}

// FingerprintBytes returns the fingerprint of b taken as opaque bytes.
func FingerprintBytes(b []byte) Fingerprint { return digest(domainBytes, b) }

// FingerprintJSON returns the fingerprint of v's JSON encoding in canonical form, so
// equal values give equal fingerprints whatever their field order or number formatting.
// v is encoded with encoding/json; a json.RawMessage or []byte of JSON is canonicalised
// as the JSON it holds.
func FingerprintJSON(v any) (Fingerprint, error) {
	var raw []byte
	switch t := v.(type) {
	case json.RawMessage:
		raw = t
	case []byte:
		raw = t
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return "", fmt.Errorf("oncekit/keys: fingerprint: encode request: %w", err)
		}
	}
	c, err := CanonicalJSON(raw)
	if err != nil {
		return "", err
	}
	return digest(domainJSON, c), nil
}

func digest(domain string, b []byte) Fingerprint {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write(b)
	return Fingerprint(fingerprintPrefix + hex.EncodeToString(h.Sum(nil)))
}

// MaxJSONDepth is how deeply [CanonicalJSON] lets arrays and objects nest, as
// encoding/json users expect of a parser facing untrusted input. A deeper value is
// refused with a [*JSONError] wrapping [ErrJSONTooDeep], at a cost linear in the input
// read so far.
const MaxJSONDepth = 128

// JSONError reports input that [CanonicalJSON] cannot canonicalise. It wraps
// [ErrInvalidJSON], and [ErrJSONTooDeep] when the value nests too deeply.
type JSONError struct {
	// Offset is the byte offset near the problem, or -1.
	Offset int64
	// Reason says what is wrong.
	Reason string
	// TooDeep is set when the value nests deeper than [MaxJSONDepth].
	TooDeep bool
}

func (e *JSONError) Error() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("oncekit/keys: invalid JSON at byte %d: %s", e.Offset, e.Reason)
	}
	return "oncekit/keys: invalid JSON: " + e.Reason
}

// Unwrap returns [ErrInvalidJSON], and [ErrJSONTooDeep] for a value nested too deeply.
func (e *JSONError) Unwrap() []error {
	if e.TooDeep {
		return []error{ErrInvalidJSON, ErrJSONTooDeep}
	}
	return []error{ErrInvalidJSON}
}

// CanonicalJSON returns the canonical form of the single JSON value in b: object members
// sorted by key (byte order of their UTF-8), no insignificant white space, strings in
// encoding/json's escaping, and numbers written by value (1, 1.0, 10e-1 and 1E0 are all
// "1"; precision is never lost). It rejects invalid UTF-8, duplicate object keys and
// trailing data with a [*JSONError], and so values nested deeper than [MaxJSONDepth].
func CanonicalJSON(b []byte) ([]byte, error) {
	if !utf8.Valid(b) {
		return nil, &JSONError{Offset: -1, Reason: "not valid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out bytes.Buffer
	if err := canonValue(dec, &out, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &JSONError{Offset: dec.InputOffset(), Reason: "data after the top-level value"}
	}
	return out.Bytes(), nil
}

func canonValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonErr(dec, err)
	}
	return canonToken(dec, tok, out, depth)
}

func canonToken(dec *json.Decoder, tok json.Token, out *bytes.Buffer, depth int) error {
	switch t := tok.(type) {
	case json.Delim:
		if depth >= MaxJSONDepth {
			return &JSONError{Offset: dec.InputOffset(), Reason: fmt.Sprintf("nested deeper than %d levels", MaxJSONDepth), TooDeep: true}
		}
		switch t {
		case '{':
			return canonObject(dec, out, depth+1)
		case '[':
			return canonArray(dec, out, depth+1)
		default:
			return &JSONError{Offset: dec.InputOffset(), Reason: "unexpected " + t.String()}
		}
	case string:
		writeString(out, t)
	case json.Number:
		n, err := canonNumber(string(t))
		if err != nil {
			return &JSONError{Offset: dec.InputOffset(), Reason: err.Error()}
		}
		out.WriteString(n)
	case bool:
		if t {
			out.WriteString("true")
		} else {
			out.WriteString("false")
		}
	case nil:
		out.WriteString("null")
	}
	return nil
}

func canonObject(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	type member struct {
		key string
		val []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonErr(dec, err)
		}
		key, _ := tok.(string)
		var val bytes.Buffer
		if err := canonValue(dec, &val, depth); err != nil {
			return err
		}
		members = append(members, member{key, val.Bytes()})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return jsonErr(dec, err)
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].key == m.key {
				return &JSONError{Offset: -1, Reason: fmt.Sprintf("duplicate object key %q", m.key)}
			}
			out.WriteByte(',')
		}
		writeString(out, m.key)
		out.WriteByte(':')
		out.Write(m.val)
	}
	out.WriteByte('}')
	return nil
}

func canonArray(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	out.WriteByte('[')
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		if err := canonValue(dec, out, depth); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // ']'
		return jsonErr(dec, err)
	}
	out.WriteByte(']')
	return nil
}

func writeString(out *bytes.Buffer, s string) {
	b, _ := json.Marshal(s) // a Go string always encodes
	out.Write(b)
}

func jsonErr(dec *json.Decoder, err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return &JSONError{Offset: syn.Offset, Reason: syn.Error()}
	}
	if errors.Is(err, io.EOF) {
		return &JSONError{Offset: dec.InputOffset(), Reason: "unexpected end of input"}
	}
	return &JSONError{Offset: dec.InputOffset(), Reason: err.Error()}
}

// canonNumber rewrites a JSON number literal by its exact decimal value: an optional
// '-', then the significant digits with the exponent applied. Integers up to 21 digits
// are written in full, other values as d.ddd "e" exponent.
func canonNumber(lit string) (string, error) {
	neg := strings.HasPrefix(lit, "-")
	lit = strings.TrimPrefix(lit, "-")
	mant, expPart, _ := strings.Cut(strings.ToLower(lit), "e")
	intPart, fracPart, _ := strings.Cut(mant, ".")
	exp := 0
	if expPart != "" {
		e, err := parseExp(expPart)
		if err != nil {
			return "", err
		}
		exp = e
	}
	digits := strings.TrimLeft(intPart+fracPart, "0")
	exp -= len(fracPart)
	if digits == "" {
		return "0", nil
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	digits = trimmed
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	// value = digits * 10^exp
	if exp >= 0 && len(digits)+exp <= 21 {
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", exp))
		return b.String(), nil
	}
	// scientific: d.ddd e(exp + len(digits) - 1)
	b.WriteByte(digits[0])
	if len(digits) > 1 {
		b.WriteByte('.')
		b.WriteString(digits[1:])
	}
	b.WriteByte('e')
	fmt.Fprintf(&b, "%d", exp+len(digits)-1)
	return b.String(), nil
}

// parseExp parses a JSON exponent ("+12", "-3", "7") bounded to keep the arithmetic exact.
func parseExp(s string) (int, error) {
	neg := false
	switch {
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	}
	s = strings.TrimLeft(s, "0")
	if len(s) > 9 {
		return 0, errors.New("number exponent out of range")
	}
	n := 0
	for i := 0; i < len(s); i++ {
		n = n*10 + int(s[i]-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

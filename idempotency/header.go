package idempotency

import (
	"errors"
	"strings"
)

// Header parsing errors.
var (
	ErrKeyMissing  = errors.New("oncekit/idempotency: the request has no idempotency key")
	ErrKeyMultiple = errors.New("oncekit/idempotency: the request has more than one idempotency key")
	ErrKeyInvalid  = errors.New("oncekit/idempotency: the idempotency key is not a valid Structured Field string")
)

// ParseKey extracts the key from the header's field values. It accepts exactly one
// value: a Structured Field string ("..." with \" and \\ escapes, printable ASCII), or a
// bare token of printable ASCII without spaces, quotes, commas or semicolons.
// Parameters (;name=value) are ignored, as Structured Fields allow them. ParseKey
// checks the syntax alone: the middleware then validates the key's length (1 to
// keys.MaxLenDefault bytes) with keys.New.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", ErrKeyMultiple
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", ErrKeyMissing
	}
	if v[0] != '"' {
		tok := v
		if i := strings.IndexByte(v, ';'); i >= 0 {
			tok = strings.TrimRight(v[:i], " \t")
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if c <= 0x20 || c >= 0x7f || c == '"' || c == ',' || c == '\\' {
				if c == ',' {
					return "", ErrKeyMultiple
				}
				return "", ErrKeyInvalid
			}
		}
		if tok == "" {
			return "", ErrKeyInvalid
		}
		return tok, nil
	}
	var b strings.Builder
	i := 1
	for ; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", ErrKeyInvalid
			}
			b.WriteByte(v[i])
		case c == '"':
			rest := strings.TrimLeft(v[i+1:], " \t")
			switch {
			case rest == "" || rest[0] == ';':
			case rest[0] == ',':
				return "", ErrKeyMultiple
			default:
				return "", ErrKeyInvalid
			}
			if b.Len() == 0 {
				return "", ErrKeyInvalid
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", ErrKeyInvalid
		default:
			b.WriteByte(c)
		}
	}
	return "", ErrKeyInvalid // unterminated
}

package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxLenDefault is the default maximum length of a key in bytes: the common maximum that
// payment providers and HTTP APIs accept for an idempotency key.
const MaxLenDefault = 255

// Key names one business intent within a [Scope]. The zero value is invalid.
type Key string

// New validates s as a key of at most [MaxLenDefault] bytes and returns it.
func New(s string) (Key, error) {
	k := Key(s)
	if err := k.Validate(); err != nil {
		return "", err
	}
	return k, nil
}

// String returns the key as a string.
func (k Key) String() string { return string(k) }

// Validate reports whether k is 1 to [MaxLenDefault] bytes of printable ASCII.
func (k Key) Validate() error { return k.ValidateLen(MaxLenDefault) }

// ValidateLen reports whether k is 1 to maxLen bytes of printable ASCII.
func (k Key) ValidateLen(maxLen int) error { return validate("key", string(k), maxLen) }

func validate(field, s string, maxLen int) error {
	if s == "" {
		return invalid(field, s, -1, 0, ErrEmpty)
	}
	if len(s) > maxLen {
		return invalid(field, s, -1, maxLen, ErrTooLong)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return invalid(field, s, i, 0, ErrInvalidByte)
		}
	}
	return nil
}

// encodingVersion prefixes every key this package composes, so that a later encoding
// can never produce a key equal to one of this encoding.
const encodingVersion = "v1"

// compose joins a key kind and its parts into a versioned key: "v1:kind:part:part".
// Parts are escaped so the result is injective: no two part lists give the same key.
// A composition longer than MaxLenDefault keeps a readable prefix and ends in "~" and the
// SHA-256 of the full composition, so it stays unique and within the limit.
func compose(kind string, parts ...string) Key {
	var b strings.Builder
	b.WriteString(encodingVersion)
	b.WriteByte(':')
	b.WriteString(kind)
	for _, p := range parts {
		b.WriteByte(':')
		escapeTo(&b, p)
	}
	s := b.String()
	if len(s) <= MaxLenDefault {
		return Key(s)
	}
	sum := sha256.Sum256([]byte(s))
	digest := hex.EncodeToString(sum[:])
	return Key(s[:MaxLenDefault-len(digest)-1] + "~" + digest)
}

// escapeTo writes p with '%', ':', '~' and every byte outside 0x21-0x7e percent-encoded.
func escapeTo(b *strings.Builder, p string) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c <= 0x20 || c >= 0x7f || c == '%' || c == ':' || c == '~' {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
}

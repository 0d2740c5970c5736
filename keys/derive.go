package keys

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxPurposeLen is the maximum length of a derivation purpose.
const MaxPurposeLen = 64

// Derive returns the child key of parent for purpose, such as "refund" for a
// compensation or "stripe-charge" for a downstream call: "purpose.<32 hex digits>".
//
// The child is deterministic (the same parent and purpose always give the same key, so
// a retried call sends the same key downstream), opaque (it reveals nothing of the
// parent, such as workflow IDs, to the provider it is sent to) and short enough for any
// provider. The purpose is 1 to [MaxPurposeLen] bytes of letters, digits, '-', '_' and '.'.
//
// A key sent outside oncekit, to a provider that many tenants share, must come from
// [DeriveIn], so that equal keys of two tenants never meet at the provider.
func Derive(parent Key, purpose string) (Key, error) {
	return derive(parent, purpose, "oncekit.derive.v1\x00")
}

// DeriveIn is [Derive] for a parent key within scope: the child also depends on the
// tenant and the operation. Use it for downstream keys, which leave the scope.
func DeriveIn(scope Scope, parent Key, purpose string) (Key, error) {
	if err := scope.Validate(); err != nil {
		return "", err
	}
	return derive(parent, purpose, "oncekit.derive-in.v1\x00"+scope.Tenant+"\x00"+scope.Operation+"\x00")
}

func derive(parent Key, purpose, domain string) (Key, error) {
	if err := parent.Validate(); err != nil {
		return "", err
	}
	if err := validatePurpose(purpose); err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write([]byte(parent))
	sum := h.Sum(nil)
	return Key(purpose + "." + hex.EncodeToString(sum[:16])), nil
}

func validatePurpose(p string) error {
	if p == "" {
		return invalid("purpose", p, -1, 0, ErrEmpty)
	}
	if len(p) > MaxPurposeLen {
		return invalid("purpose", p, -1, MaxPurposeLen, ErrTooLong)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return invalid("purpose", p, i, 0, ErrInvalidByte)
		}
	}
	return nil
}

package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxScopeLen is the maximum length in bytes of a tenant or an operation name.
const MaxScopeLen = 128

// Scope is the namespace of a key: the tenant the intent belongs to and the operation it
// performs. Two equal keys in different scopes are different intents.
type Scope struct {
	// Tenant identifies whose intent this is: an account, a customer, or a fixed name in a
	// single-tenant system. It is never empty.
	Tenant string
	// Operation is a stable name for what the intent does, such as "payments.charge". Use
	// a name you will keep: under another name, an intent recorded before is a new one.
	// An activity's operation defaults to the name Temporal registered it under, often a
	// Go function or method name, so keep that stable when code is renamed.
	Operation string
}

// Validate reports whether both fields are 1 to [MaxScopeLen] bytes of printable ASCII.
func (s Scope) Validate() error {
	if err := validate("tenant", s.Tenant, MaxScopeLen); err != nil {
		return err
	}
	return validate("operation", s.Operation, MaxScopeLen)
}

// String returns "tenant/operation" for logs.
func (s Scope) String() string { return s.Tenant + "/" + s.Operation }

// ScopePart turns any string into a valid tenant or operation, for scope parts a server
// derives from what it was sent (an authenticated user's name, a URL path) rather than
// what a client can be asked to fix. A valid value without '~' is returned as it is.
// Any other value becomes a readable prefix, with bytes outside printable ASCII and '~'
// percent-encoded, then '~' and the first 32 hex digits of its SHA-256: at most
// [MaxScopeLen] bytes, and distinct for distinct values, since only a transformed value
// contains '~'.
func ScopePart(s string) string {
	if validate("tenant", s, MaxScopeLen) == nil && !strings.Contains(s, "~") {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	suffix := "~" + hex.EncodeToString(sum[:16])
	var b strings.Builder
	escapeTo(&b, s)
	prefix := b.String()
	if limit := MaxScopeLen - len(suffix); len(prefix) > limit {
		prefix = prefix[:limit]
		// Do not end inside a percent-escape.
		if i := strings.LastIndexByte(prefix, '%'); i >= len(prefix)-2 {
			prefix = prefix[:i]
		}
	}
	return prefix + suffix
}

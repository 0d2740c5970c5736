package keys

import (
	"errors"
	"fmt"
)

// Sentinel conditions wrapped by [*ValidationError]. Test for them with [errors.Is].
var (
	// ErrEmpty reports an empty key, tenant, operation or purpose.
	ErrEmpty = errors.New("empty")
	// ErrTooLong reports a value longer than its limit.
	ErrTooLong = errors.New("too long")
	// ErrInvalidByte reports a byte outside the allowed set (printable ASCII for keys).
	ErrInvalidByte = errors.New("invalid byte")
	// ErrInvalidFingerprint reports a fingerprint that is not in a known encoding.
	ErrInvalidFingerprint = errors.New("invalid fingerprint")
	// ErrInvalidJSON reports input to [CanonicalJSON] that is not one valid JSON value.
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrJSONTooDeep reports JSON nested deeper than [MaxJSONDepth].
	ErrJSONTooDeep = errors.New("JSON nested too deeply")
)

// ValidationError reports which field of a key, scope or derivation is invalid and why.
// It wraps one of the sentinel errors of this package.
type ValidationError struct {
	// Field names what was validated: "key", "tenant", "operation", "purpose" or
	// "fingerprint".
	Field string
	// Value is the offending value, truncated to 64 bytes.
	Value string
	// Len is the length of the whole value in bytes.
	Len int
	// Offset is the byte offset of an invalid byte, or -1.
	Offset int
	// Byte is the invalid byte for [ErrInvalidByte].
	Byte byte
	// Limit is the length limit for [ErrTooLong], otherwise 0.
	Limit int
	// Err is the sentinel: [ErrEmpty], [ErrTooLong], [ErrInvalidByte] or
	// [ErrInvalidFingerprint].
	Err error
}

func (e *ValidationError) Error() string {
	switch {
	case errors.Is(e.Err, ErrEmpty):
		return fmt.Sprintf("oncekit/keys: %s is empty: supply a non-empty %s", e.Field, e.Field)
	case errors.Is(e.Err, ErrTooLong):
		return fmt.Sprintf("oncekit/keys: %s is %d bytes, over the limit of %d: shorten it or use keys.Derive for a fixed-length key",
			e.Field, e.Len, e.Limit)
	case errors.Is(e.Err, ErrInvalidByte) && e.Field == "purpose":
		return fmt.Sprintf("oncekit/keys: purpose %q has byte %#02x at offset %d: use letters, digits, '-', '_' and '.'",
			e.Value, e.Byte, e.Offset)
	case errors.Is(e.Err, ErrInvalidFingerprint) && e.Len == 0:
		return fmt.Sprintf("oncekit/keys: %s is empty: make one from the request with keys.FingerprintJSON(request) or keys.FingerprintBytes(body)", e.Field)
	case errors.Is(e.Err, ErrInvalidFingerprint):
		return fmt.Sprintf("oncekit/keys: %s %q is not a fingerprint (\"v1:\" and 64 lowercase hex digits): make one with keys.FingerprintJSON or keys.FingerprintBytes",
			e.Field, e.Value)
	case errors.Is(e.Err, ErrInvalidByte):
		return fmt.Sprintf("oncekit/keys: %s %q has byte %#02x at offset %d: only printable ASCII (0x20-0x7e) is allowed",
			e.Field, e.Value, e.Byte, e.Offset)
	default:
		return fmt.Sprintf("oncekit/keys: %s %q: %v", e.Field, e.Value, e.Err)
	}
}

func (e *ValidationError) Unwrap() error { return e.Err }

func invalid(field, value string, offset, limit int, err error) *ValidationError {
	e := &ValidationError{Field: field, Value: value, Len: len(value), Offset: offset, Limit: limit, Err: err}
	if offset >= 0 && offset < len(value) {
		e.Byte = value[offset]
	}
	if len(e.Value) > 64 {
		e.Value = e.Value[:64]
	}
	return e
}

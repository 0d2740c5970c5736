package keys

// MaxScopeLen is the maximum length in bytes of a tenant or an operation name.
const MaxScopeLen = 128

// Scope is the namespace of a key: the tenant the intent belongs to and the operation it
// performs. Two equal keys in different scopes are different intents.
type Scope struct {
	// Tenant identifies whose intent this is: an account, a customer, or a fixed name in a
	// single-tenant system. It is never empty.
	Tenant string
	// Operation is a stable name for what the intent does, such as "payments.charge". Use
	// a name you will keep; never a Go function name, which changes when code is renamed.
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

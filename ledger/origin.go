package ledger

import (
	"context"
	"unicode/utf8"
)

// Origin says where a record's intent came from, in the terms an operator starts from:
// the Temporal workflow, run and activity that made it. A record carries the origin of
// the attempt that first wrote it, in indexed columns, so that the record of a workflow
// is found by its workflow ID whatever its key is made of. The ledger imports nothing of
// Temporal: oncekit's worker plugin puts the origin of every activity it runs in the
// activity's context ([WithOrigin]), and every record written under that context carries
// it. A record written with no origin carries none.
type Origin struct {
	// WorkflowID is the workflow's ID.
	WorkflowID string
	// RunID is the ID of the workflow's run.
	RunID string
	// WorkflowType is the workflow's type: for a saga's record, the saga's name.
	WorkflowType string
	// ActivityType is the type of the activity that wrote the record, such as
	// "payments.Charge" (for a saga's record, one of the oncekit.saga activities).
	ActivityType string
}

// MaxOriginLen is the longest field of an [Origin] a record keeps, in bytes; a longer one
// is cut at a character boundary, so that it fits one index entry.
const MaxOriginLen = 1000

// IsZero reports whether o names nothing.
func (o Origin) IsZero() bool { return o == Origin{} }

type originKey struct{}

// WithOrigin returns a copy of ctx whose ledger calls record o: Do, DoTx, DoStatement,
// Claim and ClaimTx write it on the record they insert. oncekit's worker plugin calls it
// for every activity; call it yourself to record where other intents come from.
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, o)
}

// OriginFrom returns the origin [WithOrigin] put in ctx.
func OriginFrom(ctx context.Context) (Origin, bool) {
	o, ok := ctx.Value(originKey{}).(Origin)
	return o, ok
}

// originArgs are the origin's parameters of a record's statement: workflow ID, run ID,
// workflow type, activity type, each NULL when empty. A context without an origin costs
// no allocation.
func originArgs(ctx context.Context) [4]any {
	o, ok := OriginFrom(ctx)
	if !ok {
		return [4]any{nil, nil, nil, nil}
	}
	return [4]any{originText(o.WorkflowID), originText(o.RunID), originText(o.WorkflowType), originText(o.ActivityType)}
}

// originText is s as a record keeps it: NULL when empty, storable as text, and at most
// MaxOriginLen bytes.
func originText(s string) *string {
	if s == "" {
		return nil
	}
	s = storableText(s)
	if len(s) > MaxOriginLen {
		cut := MaxOriginLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return &s
}

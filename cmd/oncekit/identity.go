package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

// Activity keys are composed from Temporal identities by package keys: "v1:KIND:PART:PART"
// with each part escaped. identityKinds lists the kinds and what their parts are, so that
// a workflow ID, run ID or activity ID can be looked for in the part it occupies.
var identityKinds = []struct {
	kind  string
	parts [2]string
	// compose builds a key of the kind, so the prefix and escaping come from package keys.
	compose func(a, b string) keys.Key
}{
	{"run", [2]string{"run", "activity"}, keys.Run},
	{"local", [2]string{"run", "activity"}, keys.Local},
	{"wf", [2]string{"workflow", "activity"}, keys.Workflow},
	{"lwf", [2]string{"workflow", "activity"}, func(w, a string) keys.Key {
		k, _ := keys.Identity{WorkflowID: w, ActivityID: a, Local: true}.Key(keys.WorkflowScoped)
		return k
	}},
	{"sa", [2]string{"activity", "activity run"}, keys.Standalone},
	// A saga's default key: keys.Business("saga", workflow ID, original run ID).
	{"biz:saga", [2]string{"workflow", "run"}, func(w, r string) keys.Key {
		k, _ := keys.Business("saga", w, r)
		return k
	}},
}

// identity is what an operator looks records up by.
type identity struct {
	workflowID, runID, activityID, activityType string
}

func (id identity) empty() bool {
	return id.workflowID == "" && id.runID == "" && id.activityID == "" && id.activityType == ""
}

// origin is the part of id that records carry in their origin columns, and the key
// patterns that find the records written without an origin. With an activity ID, which
// no column holds, the keys alone decide.
func (id identity) origin() (ledger.Origin, []string, error) {
	if id.activityID != "" {
		if id.activityType != "" {
			return ledger.Origin{}, nil, usageError{"--activity-id is looked for in keys, which do not hold the activity type: drop --activity-type or --activity-id"}
		}
		p, err := id.patterns()
		return ledger.Origin{}, p, err
	}
	o := ledger.Origin{WorkflowID: id.workflowID, RunID: id.runID, ActivityType: id.activityType}
	byKey := identity{workflowID: id.workflowID, runID: id.runID}
	if byKey.empty() {
		return o, nil, nil
	}
	// Records without an origin are found by the keys that hold these IDs, when some
	// kind of key holds them all.
	p, _ := byKey.patterns()
	return o, p, nil
}

// placeholder stands for an unknown part while a key is composed: a byte no ID holds,
// which the escaping turns into "%01", found again in the composed key.
const placeholder = "\x01"

// escapedPart returns s as package keys escapes it inside a key.
func escapedPart(s string) string {
	k := string(keys.Run(s, "x"))
	return strings.TrimSuffix(strings.TrimPrefix(k, "v1:run:"), ":x")
}

// patterns returns the LIKE patterns of the keys that carry id: one per kind of key with
// a part for each ID given. It returns none when id is empty, and an error when no kind
// of key carries all of the IDs given.
func (id identity) patterns() ([]string, error) {
	if id.workflowID == "" && id.runID == "" && id.activityID == "" {
		return nil, nil
	}
	given := map[string]string{"workflow": id.workflowID, "run": id.runID, "activity": id.activityID}
	var out []string
	for _, k := range identityKinds {
		values := [2]string{placeholder, placeholder}
		used := 0
		for i, part := range k.parts {
			if v := given[part]; v != "" {
				values[i] = v
				used++
			}
		}
		need := 0
		for _, v := range given {
			if v != "" {
				need++
			}
		}
		if used != need {
			continue // this kind has no part for one of the IDs
		}
		composed := string(k.compose(values[0], values[1]))
		if strings.Contains(composed, "~") && !strings.Contains(values[0]+values[1], "~") {
			return nil, usageError{"an ID is too long to be looked for in keys: keys that long are stored hashed"}
		}
		// The escaped placeholder marks where an unknown part goes.
		var b strings.Builder
		for i, piece := range strings.Split(composed, escapedPart(placeholder)) {
			if i > 0 {
				b.WriteString("%")
			}
			b.WriteString(likeEscape(piece))
		}
		out = append(out, b.String())
	}
	if len(out) == 0 {
		return nil, usageError{"no kind of key carries all of --workflow-id, --run-id and --activity-id (an activity key has a run ID or a workflow ID, not both): drop one"}
	}
	return out, nil
}

// likeEscape escapes s for a LIKE pattern whose escape character is '\'.
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

// describeKey says what a key composed by package keys is made of, such as "run-scoped
// activity key: run ID 0b7..., activity ID 5", or "" for a key it did not compose.
func describeKey(k keys.Key) string {
	s := string(k)
	rest, ok := strings.CutPrefix(s, "v1:")
	if !ok || strings.Contains(s, "~") {
		return ""
	}
	fields := strings.Split(rest, ":")
	names := map[string]struct {
		what  string
		parts []string
	}{
		"run":   {"run-scoped activity key", []string{"run ID", "activity ID"}},
		"local": {"run-scoped local activity key", []string{"run ID", "activity ID"}},
		"wf":    {"workflow-scoped activity key", []string{"workflow ID", "activity ID"}},
		"lwf":   {"workflow-scoped local activity key", []string{"workflow ID", "activity ID"}},
		"sa":    {"standalone activity key", []string{"activity ID", "activity run ID"}},
	}
	if len(fields) >= 2 && fields[0] == "biz" {
		parts := make([]string, 0, len(fields)-1)
		for _, f := range fields[1:] {
			parts = append(parts, strconv.Quote(unescapePart(f)))
		}
		if len(fields) == 4 && fields[1] == "saga" {
			return fmt.Sprintf("a saga's default key: workflow ID %s, original run ID %s", parts[1], parts[2])
		}
		return "business key: " + strings.Join(parts, ", ")
	}
	n, ok := names[fields[0]]
	if !ok || len(fields) != 3 {
		return ""
	}
	return fmt.Sprintf("%s: %s %q, %s %q", n.what, n.parts[0], unescapePart(fields[1]), n.parts[1], unescapePart(fields[2]))
}

// unescapePart undoes the percent-escaping of a key's part.
func unescapePart(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) {
			if v, err := strconv.ParseUint(p[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

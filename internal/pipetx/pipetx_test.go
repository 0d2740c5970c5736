package pipetx

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// A statement travels in a batch unless it is several in one string (which only the
// simple protocol takes) or its first argument sets a per-query mode or result format.
func TestPipelinable(t *testing.T) {
	for _, c := range []struct {
		sql  string
		args []any
		want bool
	}{
		{"INSERT INTO t VALUES (1)", nil, true},
		{"INSERT INTO t VALUES (1);", nil, true},
		{"INSERT INTO t VALUES (1) ; ;\n\t ", nil, true},
		{"INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)", nil, false},
		{"INSERT INTO t VALUES (1);\nINSERT INTO t VALUES (2);", nil, false},
		{"INSERT INTO t VALUES ($1)", []any{1}, true},
		{"INSERT INTO t VALUES ($1); SELECT 1", []any{1}, true}, // refused by the server, as in pgx
		{"SELECT $1", []any{pgx.QueryExecModeSimpleProtocol, 1}, false},
		{"SELECT $1", []any{pgx.QueryResultFormats{pgx.TextFormatCode}, 1}, false},
		{"SELECT $1", []any{pgx.QueryResultFormatsByOID{}, 1}, false},
	} {
		if got := pipelinable(c.sql, c.args); got != c.want {
			t.Errorf("pipelinable(%q, %v) = %v, want %v", c.sql, c.args, got, c.want)
		}
	}
}

package ledger

import (
	"errors"
	"strconv"
	"strings"
)

// sqlToken is a token of a statement, as far as [splitStatement] needs to tell them
// apart: words (lower-cased), parentheses, commas and semicolons at their nesting depth,
// and the highest $n parameter. Strings, quoted identifiers and comments are skipped
// whole, so that nothing inside them counts.
type sqlToken struct {
	kind       byte // 'w' word, '(' ')' ',' ';', 'o' anything else
	word       string
	start, end int
	depth      int
}

// scanSQL tokenizes sql and returns its tokens and the highest parameter number it
// references.
func scanSQL(sql string) ([]sqlToken, int, error) {
	var toks []sqlToken
	maxParam, depth := 0, 0
	i := 0
	for i < len(sql) {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				i = len(sql)
			} else {
				i += j + 1
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			nest := 1
			j := i + 2
			for j < len(sql) && nest > 0 {
				switch {
				case strings.HasPrefix(sql[j:], "/*"):
					nest++
					j += 2
				case strings.HasPrefix(sql[j:], "*/"):
					nest--
					j += 2
				default:
					j++
				}
			}
			if nest > 0 {
				return nil, 0, errors.New("unterminated comment")
			}
			i = j
		case c == '\'':
			// E'...' takes backslash escapes; every other string only doubled quotes.
			esc := len(toks) > 0 && toks[len(toks)-1].end == i && (toks[len(toks)-1].word == "e")
			if esc {
				toks = toks[:len(toks)-1]
			}
			j, err := skipQuoted(sql, i, '\'', esc)
			if err != nil {
				return nil, 0, err
			}
			toks = append(toks, sqlToken{kind: 'o', start: i, end: j, depth: depth})
			i = j
		case c == '"':
			j, err := skipQuoted(sql, i, '"', false)
			if err != nil {
				return nil, 0, err
			}
			toks = append(toks, sqlToken{kind: 'o', start: i, end: j, depth: depth})
			i = j
		case c == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9':
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			n, err := strconv.Atoi(sql[i+1 : j])
			if err != nil {
				return nil, 0, errors.New("parameter number out of range")
			}
			maxParam = max(maxParam, n)
			toks = append(toks, sqlToken{kind: 'o', start: i, end: j, depth: depth})
			i = j
		case c == '$':
			// A dollar-quoted string: $tag$ ... $tag$.
			j := i + 1
			for j < len(sql) && isWordByte(sql[j]) && sql[j] != '$' {
				j++
			}
			if j >= len(sql) || sql[j] != '$' {
				toks = append(toks, sqlToken{kind: 'o', start: i, end: i + 1, depth: depth})
				i++
				continue
			}
			tag := sql[i : j+1]
			k := strings.Index(sql[j+1:], tag)
			if k < 0 {
				return nil, 0, errors.New("unterminated dollar-quoted string")
			}
			end := j + 1 + k + len(tag)
			toks = append(toks, sqlToken{kind: 'o', start: i, end: end, depth: depth})
			i = end
		case isWordByte(c) && !(c >= '0' && c <= '9'):
			j := i
			for j < len(sql) && (isWordByte(sql[j]) || sql[j] == '$') {
				j++
			}
			toks = append(toks, sqlToken{kind: 'w', word: strings.ToLower(sql[i:j]), start: i, end: j, depth: depth})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(sql) && (isWordByte(sql[j]) || sql[j] == '.') {
				j++
			}
			toks = append(toks, sqlToken{kind: 'o', start: i, end: j, depth: depth})
			i = j
		case c == '(':
			toks = append(toks, sqlToken{kind: '(', start: i, end: i + 1, depth: depth})
			depth++
			i++
		case c == ')':
			depth--
			if depth < 0 {
				return nil, 0, errors.New("unbalanced parentheses")
			}
			toks = append(toks, sqlToken{kind: ')', start: i, end: i + 1, depth: depth})
			i++
		case c == ',' || c == ';':
			toks = append(toks, sqlToken{kind: c, start: i, end: i + 1, depth: depth})
			i++
		default:
			toks = append(toks, sqlToken{kind: 'o', start: i, end: i + 1, depth: depth})
			i++
		}
	}
	if depth != 0 {
		return nil, 0, errors.New("unbalanced parentheses")
	}
	return toks, maxParam, nil
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// skipQuoted returns the offset just past the quoted text that starts at sql[i].
func skipQuoted(sql string, i int, q byte, backslash bool) (int, error) {
	j := i + 1
	for j < len(sql) {
		switch {
		case backslash && sql[j] == '\\':
			j += 2
		case sql[j] == q && j+1 < len(sql) && sql[j+1] == q:
			j += 2
		case sql[j] == q:
			return j + 1, nil
		default:
			j++
		}
	}
	return 0, errors.New("unterminated quoted text")
}

// stmtParts is a statement split for the guarded form: its own common table
// expressions, to be listed beside the ledger's, and its main statement, which becomes
// one of them.
type stmtParts struct {
	recursive bool
	ctes      string // the statement's WITH list without WITH, or ""
	main      string
	maxParam  int
}

// transactionControl are the first words of statements that begin or end transactions.
var transactionControl = map[string]bool{"begin": true, "start": true, "commit": true, "end": true, "rollback": true,
	"abort": true, "savepoint": true, "release": true, "prepare": true}

// splitStatement checks that sql is one statement the guarded form can run (an
// INSERT, UPDATE or DELETE with RETURNING, or a WITH query) and splits it.
func splitStatement(sql string) (stmtParts, error) {
	toks, maxParam, err := scanSQL(sql)
	if err != nil {
		return stmtParts{}, err
	}
	end := len(sql)
	for i, t := range toks {
		if t.kind != ';' {
			continue
		}
		for _, u := range toks[i+1:] {
			if u.kind != ';' {
				return stmtParts{}, errors.New("more than one statement: send one INSERT, UPDATE or DELETE with RETURNING, or one WITH query of them")
			}
		}
		end = t.start
		toks = toks[:i]
		break
	}
	if len(toks) == 0 || toks[0].kind != 'w' {
		return stmtParts{}, errors.New("the statement must be an INSERT, UPDATE or DELETE with RETURNING, or a WITH query of them")
	}
	first := toks[0].word
	switch {
	case transactionControl[first]:
		return stmtParts{}, errors.New("a transaction-control statement (" + strings.ToUpper(first) + ") cannot run guarded: the ledger commits the statement itself")
	case first == "insert" || first == "update" || first == "delete":
		if !returning(toks) {
			return stmtParts{}, errors.New("the statement has no RETURNING clause: the rows it returns are the stored response, so add RETURNING (RETURNING 1 if nothing else)")
		}
		return stmtParts{main: strings.TrimSpace(sql[:end]), maxParam: maxParam}, nil
	case first != "with":
		return stmtParts{}, errors.New("the statement must be an INSERT, UPDATE or DELETE with RETURNING, or a WITH query of them, not " + strings.ToUpper(first))
	}
	p := stmtParts{maxParam: maxParam}
	rest := toks[1:]
	listStart := toks[0].end
	if len(rest) > 0 && rest[0].kind == 'w' && rest[0].word == "recursive" {
		p.recursive = true
		listStart = rest[0].end
		rest = rest[1:]
	}
	// The main statement starts at the first top-level INSERT, UPDATE, DELETE, SELECT,
	// VALUES or TABLE that does not stand where a common table expression's name does
	// (after WITH or a comma).
	prev := byte(',')
	for k, t := range rest {
		if t.depth != 0 {
			continue
		}
		if t.kind == 'w' && prev != ',' && mainWords[t.word] {
			p.ctes = strings.TrimSpace(sql[listStart:t.start])
			p.main = strings.TrimSpace(sql[t.start:end])
			if (t.word == "insert" || t.word == "update" || t.word == "delete") && !returning(rest[k:]) {
				return stmtParts{}, errors.New("the statement has no RETURNING clause: the rows it returns are the stored response, so add RETURNING (RETURNING 1 if nothing else)")
			}
			if p.ctes == "" {
				return stmtParts{}, errors.New("the WITH query lists no common table expression")
			}
			return p, nil
		}
		prev = t.kind
	}
	return stmtParts{}, errors.New("the WITH query has no main statement")
}

var mainWords = map[string]bool{"insert": true, "update": true, "delete": true, "select": true, "values": true, "table": true}

// returning reports whether toks, a statement whose tokens start at depth 0, has a
// top-level RETURNING clause.
func returning(toks []sqlToken) bool {
	d := toks[0].depth
	for _, t := range toks {
		if t.depth == d && t.kind == 'w' && t.word == "returning" {
			return true
		}
	}
	return false
}

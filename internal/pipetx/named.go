package pipetx

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// NamedLimit is how many statements [PrepareNamed] keeps prepared on a connection;
// past it, the connection's are deallocated and prepared again as they come.
const NamedLimit = 128

// PrepareNamed prepares sql on conn under its own text as pgx's name, once per
// connection: pgx then answers from memory, sends the statement by name wherever sql is
// queued, and, unlike the statements of its cache, never deallocates it because a batch
// that carried it failed.
func PrepareNamed(ctx context.Context, conn *pgx.Conn, sql string) (*pgconn.StatementDescription, error) {
	m := namedOf(conn.PgConn())
	m.mu.Lock()
	_, known := m.names[sql]
	var drop []string
	if !known && len(m.names) >= NamedLimit {
		for n := range m.names {
			drop = append(drop, n)
		}
		clear(m.names)
	}
	m.mu.Unlock()
	for _, n := range drop {
		if err := conn.Deallocate(ctx, n); err != nil {
			return nil, err
		}
	}
	sd, err := conn.Prepare(ctx, sql, sql)
	if err != nil {
		return nil, err
	}
	if !known {
		m.mu.Lock()
		m.names[sql] = struct{}{}
		m.mu.Unlock()
	}
	return sd, nil
}

// named holds the statements PrepareNamed prepared on a connection.
type named struct {
	mu    sync.Mutex
	names map[string]struct{}
}

var namedByConn sync.Map // weak.Pointer[pgconn.PgConn] -> *named

func namedOf(pc *pgconn.PgConn) *named {
	key := weak.Make(pc)
	if m, ok := namedByConn.Load(key); ok {
		return m.(*named)
	}
	m := &named{names: map[string]struct{}{}}
	if actual, loaded := namedByConn.LoadOrStore(key, m); loaded {
		return actual.(*named)
	}
	runtime.AddCleanup(pc, func(k weak.Pointer[pgconn.PgConn]) { namedByConn.Delete(k) }, key)
	return m
}

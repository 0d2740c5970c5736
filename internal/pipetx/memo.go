package pipetx

import (
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// memoLimit bounds the descriptions kept per connection; past it the memo starts over,
// which costs a guarded Tx one more round trip per statement it meets again.
const memoLimit = 512

// memo holds, per connection, the descriptions of the statements a guarded Tx described
// on it, and whether the connection's exec mode prepares or describes a batch before
// running it.
type memo struct {
	preparesFirst bool

	mu  sync.Mutex
	sds map[string]*pgconn.StatementDescription
}

// memos maps a connection, held weakly, to its memo; a connection's entry goes when the
// connection does.
var memos sync.Map // weak.Pointer[pgconn.PgConn] -> *memo

func memoOf(conn *pgx.Conn) *memo {
	pc := conn.PgConn()
	key := weak.Make(pc)
	if m, ok := memos.Load(key); ok {
		return m.(*memo)
	}
	mode := conn.Config().DefaultQueryExecMode
	m := &memo{
		preparesFirst: mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeCacheDescribe ||
			mode == pgx.QueryExecModeDescribeExec,
		sds: map[string]*pgconn.StatementDescription{},
	}
	if actual, loaded := memos.LoadOrStore(key, m); loaded {
		return actual.(*memo)
	}
	runtime.AddCleanup(pc, func(k weak.Pointer[pgconn.PgConn]) { memos.Delete(k) }, key)
	return m
}

func (m *memo) get(sql string) *pgconn.StatementDescription {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sds[sql]
}

func (m *memo) put(sql string, sd *pgconn.StatementDescription) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.sds) >= memoLimit {
		clear(m.sds)
	}
	m.sds[sql] = sd
}

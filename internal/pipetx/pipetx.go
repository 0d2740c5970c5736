// Package pipetx is a pgx.Tx that sends nothing until its first statement, and then
// sends a prefix (BEGIN, a claim, a savepoint) in the same round trip as that statement.
// The ledger's Do and the inbox use it to give a guarded transaction the round
// trips of the bare one.
package pipetx

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Sender sends a batch: a connection or a transaction.
type Sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Config says what a [Tx] sends before its first statement.
type Config struct {
	// Via is the connection (Begin set) or the caller's transaction.
	Via Sender
	// Begin makes the prefix begin the transaction.
	Begin bool
	// Prefix travels, after BEGIN, in the round trip of the first statement. Its first
	// statement (BEGIN aside) opens what the owner rolls back to, such as a savepoint.
	Prefix []*pgx.QueuedQuery
	// ClaimAt is the index within Prefix of the claim statement, or -1 for none. A
	// claim refuses by failing with a division by zero, which makes PostgreSQL skip
	// the rest of the pipeline.
	ClaimAt int
	// Checked claims answer true or false instead of failing, and are read before
	// the statement that travelled with them.
	Checked bool
	// Refused is what every statement returns once the claim was refused and
	// OnRefused gave no way on.
	Refused error
	// OnRefused is called when the claim was refused, once the batch that carried it
	// has been read to its end. It either takes the key and says how to go on, and the
	// statements that travelled with the claim are sent again behind the new prefix,
	// or returns an error, which every statement returns from then on. Nil means
	// Refused at once.
	OnRefused func(ctx context.Context) (*Resume, error)
	// Managed is what Commit and Rollback return: the owner ends the transaction.
	Managed error
	// Guard keeps the first statements from failing before they run in the modes of
	// pgx that prepare or describe a batch first: a statement PostgreSQL cannot parse
	// (an unknown table) would otherwise be refused before the prefix runs, leaving a
	// caller's transaction aborted with nothing to roll back to, and an argument pgx
	// cannot encode would close the connection with the prefix half sent. A guarded
	// Tx sends the prefix alone before a statement it has not seen described on the
	// connection, and encodes the arguments of one it has before sending anything.
	Guard bool
}

// Resume is how a [Tx] goes on after OnRefused took the key.
type Resume struct {
	// Tx is the transaction OnRefused began, or nil to go on in the current one.
	Tx pgx.Tx
	// Prefix replaces Config.Prefix, with the transaction (or savepoint) already open.
	Prefix []*pgx.QueuedQuery
	// ClaimAt is the index within Prefix of the claim, or -1.
	ClaimAt int
}

// Tx is the transaction handed to a guarded function. Nothing is sent when it is made:
// the prefix (and BEGIN) travels in the same round trip as the function's first
// statement, or with whatever its owner sends next when the function sends none. So
// a guarded execution costs the round trips of the bare transaction less one: BEGIN has
// none of its own.
//
// A claim statement fails (it divides by zero) when the key is taken, which makes
// PostgreSQL skip the rest of the pipeline: the first statement never runs then, and
// every later one returns Config.Refused without being sent.
type Tx struct {
	cfg Config

	begin   bool               // the prefix begins the transaction
	prefix  []*pgx.QueuedQuery // what travels before the first statement
	claimAt int                // the claim's index in prefix, or -1
	sent    bool               // the prefix has been sent
	opened  bool               // the transaction or savepoint the prefix opens exists
	tx      pgx.Tx             // the transaction, once begun
	refused bool               // the claim was refused and nothing took the key
	err     error              // why nothing more may be sent
	eqb     pgx.ExtendedQueryBuilder
}

// New returns a Tx that has sent nothing yet.
func New(cfg Config) *Tx {
	return &Tx{cfg: cfg, begin: cfg.Begin, prefix: cfg.Prefix, claimAt: cfg.ClaimAt}
}

// Queued is a query for a prefix.
func Queued(sql string, args ...any) *pgx.QueuedQuery {
	return &pgx.QueuedQuery{SQL: sql, Arguments: args}
}

// Sent reports whether the prefix has been sent.
func (p *Tx) Sent() bool { return p.sent }

// Opened reports whether what the prefix opens (the transaction, or the caller's
// savepoint) exists, so that there is something to roll back.
func (p *Tx) Opened() bool { return p.opened }

// Refused reports whether the claim was refused.
func (p *Tx) Refused() bool { return p.refused }

// Checked reports whether the claim answers instead of failing.
func (p *Tx) Checked() bool { return p.cfg.Checked }

// Err is why nothing more may be sent: the claim was refused or the send failed.
func (p *Tx) Err() error { return p.err }

// Send sends the queries of b, behind the prefix when it has not been sent yet. On
// success the returned results are positioned at b's first query.
func (p *Tx) Send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if p.err != nil {
		return nil, p.err
	}
	if !p.sent && p.cfg.Guard && len(b.QueuedQueries) > 0 {
		if err := p.guard(ctx, b); err != nil {
			return nil, err
		}
	}
	if p.sent {
		return p.Current().SendBatch(ctx, b), nil
	}
	for {
		br, err := p.sendPrefixed(ctx, b)
		if !p.refused {
			return br, err
		}
		if p.cfg.OnRefused == nil {
			p.err = p.cfg.Refused
			return nil, p.err
		}
		resume, err := p.cfg.OnRefused(ctx)
		if err != nil {
			p.err = err
			return nil, err
		}
		p.resume(resume)
	}
}

// resume goes on after the key was taken by OnRefused: what it opened is open.
func (p *Tx) resume(r *Resume) {
	p.refused, p.sent, p.err = false, false, nil
	p.begin, p.prefix, p.claimAt = false, r.Prefix, r.ClaimAt
	p.opened = true
	if r.Tx != nil {
		p.tx = r.Tx
	}
}

// sendPrefixed sends the prefix and b in one batch and reads the prefix's results.
func (p *Tx) sendPrefixed(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	p.sent = true
	full := &pgx.Batch{}
	skip := len(p.prefix)
	if p.begin {
		full.BeginTx(pgx.TxOptions{})
		skip++
	}
	full.QueuedQueries = append(full.QueuedQueries, p.prefix...)
	for _, q := range b.QueuedQueries {
		// A copy: pgx keeps a sent query's statement description in it, and a batch
		// that failed (a refused claim) may have had its statements deallocated.
		full.QueuedQueries = append(full.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn})
	}
	var br pgx.BatchResults
	if p.tx != nil {
		br = p.tx.SendBatch(ctx, full)
	} else {
		br = p.cfg.Via.SendBatch(ctx, full)
	}
	if p.begin {
		p.tx = br.Tx()
	}
	claim := p.claimAt
	if claim >= 0 && p.begin {
		claim++
	}
	for i := range skip {
		if p.cfg.Checked && i == claim {
			var ok bool
			if err := br.QueryRow().Scan(&ok); err != nil {
				_ = br.Close()
				p.err = err
				return nil, err
			}
			if !ok {
				_ = br.Close()
				p.refused = true
				return nil, p.cfg.Refused
			}
			continue
		}
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if i == claim && pgsql.Code(err) == pgsql.DivisionByZero {
				p.refused = true
				return nil, p.cfg.Refused
			}
			p.err = err
			return nil, err
		}
		if i == 0 {
			p.opened = true
		}
	}
	return br, nil
}

// Flush sends the prefix alone, for an operation that cannot travel in a batch.
func (p *Tx) Flush(ctx context.Context) error {
	if p.sent {
		return p.err
	}
	br, err := p.Send(ctx, &pgx.Batch{})
	if err != nil {
		return err
	}
	return br.Close()
}

// Begin starts a pseudo nested transaction (a savepoint) in the managed transaction.
func (p *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := p.Flush(ctx); err != nil {
		return nil, err
	}
	return p.Current().Begin(ctx)
}

// Commit refuses: the owner commits the transaction.
func (p *Tx) Commit(context.Context) error { return p.cfg.Managed }

// Rollback refuses: the owner rolls the transaction back.
func (p *Tx) Rollback(context.Context) error { return p.cfg.Managed }

func (p *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := p.Flush(ctx); err != nil {
		return 0, err
	}
	return p.Current().CopyFrom(ctx, table, cols, src)
}

func (p *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br, err := p.Send(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// LargeObjects sends the claim first, on a background context since this method has
// none; a refused claim shows in the large objects' first error.
func (p *Tx) LargeObjects() pgx.LargeObjects {
	_ = p.Flush(context.Background())
	return p.Current().LargeObjects()
}

func (p *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := p.Flush(ctx); err != nil {
		return nil, err
	}
	return p.Current().Prepare(ctx, name, sql)
}

func (p *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.sent || !pipelinable(sql, args) {
		if err := p.Flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return p.Current().Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := p.Send(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (p *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.sent || !pipelinable(sql, args) {
		if err := p.Flush(ctx); err != nil {
			return nil, err
		}
		return p.Current().Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := p.Send(ctx, b)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (p *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return &pipeRow{rows: rows, err: err}
}

// Conn sends the claim first, on a background context since this method has none, so
// that statements sent on the connection itself run inside the claimed transaction.
func (p *Tx) Conn() *pgx.Conn {
	_ = p.Flush(context.Background())
	return p.Current().Conn()
}

// Current is the transaction after the prefix was sent.
func (p *Tx) Current() pgx.Tx {
	if p.tx != nil {
		return p.tx
	}
	return p.cfg.Via.(pgx.Tx)
}

// conn is the connection the Tx sends on.
func (p *Tx) conn() *pgx.Conn {
	if p.tx != nil {
		return p.tx.Conn()
	}
	switch v := p.cfg.Via.(type) {
	case pgx.Tx:
		return v.Conn()
	case *pgx.Conn:
		return v
	}
	return nil
}

// guard makes sure that the statements of b cannot fail before they run once the
// prefix is sent with them: it encodes their arguments against descriptions seen on
// the connection, and for a statement never described there it sends the prefix alone
// and describes the statement inside what the prefix opened. An error it returns is
// the statement's own, with nothing sent or what was sent still open for the owner
// to roll back.
func (p *Tx) guard(ctx context.Context, b *pgx.Batch) error {
	conn := p.conn()
	if conn == nil {
		return nil
	}
	m := memoOf(conn)
	if !m.preparesFirst {
		return nil
	}
	for _, q := range b.QueuedQueries {
		sql, args, err := rewrite(ctx, conn, q.SQL, q.Arguments)
		if err != nil {
			return err
		}
		sd := m.get(sql)
		if sd == nil {
			// Never described on this connection: open what the prefix opens first, so
			// that a statement PostgreSQL refuses to parse fails inside it.
			if err := p.Flush(ctx); err != nil {
				return err
			}
			sd, err = p.Current().Conn().Prepare(ctx, "", sql)
			if err != nil {
				return err
			}
			m.put(sql, sd)
		}
		if err := p.eqb.Build(conn.TypeMap(), sd, args); err != nil {
			return err
		}
	}
	return nil
}

// rewrite applies a query rewriter (such as pgx.NamedArgs) the way pgx will.
func rewrite(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	if len(args) > 0 {
		if r, ok := args[0].(pgx.QueryRewriter); ok {
			return r.RewriteQuery(ctx, conn, sql, args[1:])
		}
	}
	return sql, args, nil
}

// batchRows closes its batch once the rows are read or closed.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		_ = r.br.Close()
	}
}

// pipeRow is QueryRow's row, with pgx's semantics.
type pipeRow struct {
	rows pgx.Rows
	err  error
}

func (r *pipeRow) Scan(dest ...any) error {
	if r.err != nil {
		if r.rows != nil {
			r.rows.Close()
		}
		return r.err
	}
	rows := r.rows
	defer rows.Close()
	if !rows.Next() {
		if rows.Err() == nil {
			return pgx.ErrNoRows
		}
		return rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// pipelinable reports whether a statement can travel in a batch: pgx batches take no
// per-query mode or result formats, and an Exec without arguments runs with the simple
// protocol, which allows several statements in one string where a batch does not.
func pipelinable(sql string, args []any) bool {
	if len(args) == 0 {
		// One statement: no semicolon but trailing ones.
		i := strings.IndexByte(sql, ';')
		return i < 0 || strings.TrimRight(sql[i:], " \t\r\n;") == ""
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

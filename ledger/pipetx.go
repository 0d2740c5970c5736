package ledger

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// batchSender sends a batch: a connection or a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// errClaimRefused is what fn's statements return after the claim that travelled with
// the first of them was refused. fn's outcome is discarded then; the ledger settles the
// call from the key's record.
var errClaimRefused = errors.New("oncekit/ledger: the key is taken by another attempt: return this error")

// pipeTx is the transaction handed to fn. Nothing is sent when it is made: the claim
// (and, in the ledger's own transaction, BEGIN) travels in the same round trip as fn's
// first statement, or as the commit when fn sends none. So a guarded execution costs
// the round trips of the bare transaction less one: BEGIN has none of its own.
//
// A claim statement fails (it divides by zero) when the key is taken, which makes
// PostgreSQL skip the rest of the pipeline: fn's first statement never runs then, and
// every later one returns errClaimRefused without being sent.
type pipeTx struct {
	via     batchSender // the connection (own transaction) or the caller's transaction
	beginTx bool        // whether the pipeline begins the transaction
	prefix  []*pgx.QueuedQuery
	claimAt int // index of the claim statement within prefix, or -1 for none
	// checked is set when the claim answers true or false instead of failing.
	checked bool

	sent    bool
	tx      pgx.Tx // the transaction, once sent
	refused bool   // the claim was refused
	err     error  // why nothing more may be sent: the claim was refused or the send failed
}

func newPipeTx(via batchSender, beginTx bool, claimAt int, prefix ...*pgx.QueuedQuery) *pipeTx {
	return &pipeTx{via: via, beginTx: beginTx, prefix: prefix, claimAt: claimAt}
}

func queued(sql string, args ...any) *pgx.QueuedQuery {
	return &pgx.QueuedQuery{SQL: sql, Arguments: args}
}

// send sends the queries of b, behind the prefix when it has not been sent yet. On
// success the returned results are positioned at b's first query.
func (p *pipeTx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if p.err != nil {
		return nil, p.err
	}
	if p.sent {
		if p.tx != nil {
			return p.tx.SendBatch(ctx, b), nil
		}
		return p.via.SendBatch(ctx, b), nil
	}
	p.sent = true
	full := &pgx.Batch{}
	skip := len(p.prefix)
	if p.beginTx {
		full.BeginTx(pgx.TxOptions{})
		skip++
	}
	full.QueuedQueries = append(full.QueuedQueries, p.prefix...)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	br := p.via.SendBatch(ctx, full)
	if p.beginTx {
		p.tx = br.Tx()
	}
	for i := range skip {
		if p.checked && p.claimAt >= 0 && i == p.claimAt+boolInt(p.beginTx) {
			var ok bool
			if err := br.QueryRow().Scan(&ok); err != nil {
				_ = br.Close()
				p.err = err
				return nil, err
			}
			if !ok {
				_ = br.Close()
				p.refused, p.err = true, errClaimRefused
				return nil, p.err
			}
			continue
		}
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if p.claimAt >= 0 && i == p.claimAt+boolInt(p.beginTx) && isRefusal(err) {
				p.refused = true
				p.err = errClaimRefused
			} else {
				p.err = err
			}
			return nil, p.err
		}
	}
	return br, nil
}

// flush sends the prefix alone, for an operation that cannot travel in a batch.
func (p *pipeTx) flush(ctx context.Context) error {
	if p.sent {
		return p.err
	}
	br, err := p.send(ctx, &pgx.Batch{})
	if err != nil {
		return err
	}
	return br.Close()
}

// Begin starts a pseudo nested transaction (a savepoint) in the managed transaction.
func (p *pipeTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := p.flush(ctx); err != nil {
		return nil, err
	}
	return p.current().Begin(ctx)
}

// Commit refuses: the ledger commits its own transaction.
func (p *pipeTx) Commit(context.Context) error { return ErrManagedTx }

// Rollback refuses: the ledger rolls back its own transaction.
func (p *pipeTx) Rollback(context.Context) error { return ErrManagedTx }

func (p *pipeTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := p.flush(ctx); err != nil {
		return 0, err
	}
	return p.current().CopyFrom(ctx, table, cols, src)
}

func (p *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br, err := p.send(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// LargeObjects sends the claim first, on a background context since this method has
// none; a refused claim shows in the large objects' first error.
func (p *pipeTx) LargeObjects() pgx.LargeObjects {
	_ = p.flush(context.Background())
	return p.current().LargeObjects()
}

func (p *pipeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := p.flush(ctx); err != nil {
		return nil, err
	}
	return p.current().Prepare(ctx, name, sql)
}

func (p *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.sent || !pipelinable(sql, args) {
		if err := p.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return p.current().Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := p.send(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (p *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.sent || !pipelinable(sql, args) {
		if err := p.flush(ctx); err != nil {
			return nil, err
		}
		return p.current().Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := p.send(ctx, b)
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

func (p *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return &pipeRow{rows: rows, err: err}
}

// Conn sends the claim first, on a background context since this method has none, so
// that statements sent on the connection itself run inside the claimed transaction.
func (p *pipeTx) Conn() *pgx.Conn {
	_ = p.flush(context.Background())
	return p.current().Conn()
}

// current is the transaction after the prefix was sent.
func (p *pipeTx) current() pgx.Tx {
	if p.tx != nil {
		return p.tx
	}
	return p.via.(pgx.Tx)
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
		s := strings.TrimRight(sql, " \t\r\n;")
		return !strings.Contains(s, ";")
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// isRefusal reports whether a claim statement refused the key: it divides by zero then.
func isRefusal(err error) bool {
	return pgsql.Code(err) == pgsql.DivisionByZero
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

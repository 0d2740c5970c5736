// Package pipetx is a pgx.Tx that sends nothing until its first statement, and then
// sends a prefix (BEGIN, a claim, a savepoint) in the same round trip as that statement.
// The ledger's local mode and the inbox use it to give a guarded transaction the round
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
	// Prefix travels, after BEGIN, in the round trip of the first statement.
	Prefix []*pgx.QueuedQuery
	// ClaimAt is the index within Prefix of the claim statement, or -1 for none. A
	// claim refuses by failing with a division by zero, which makes PostgreSQL skip
	// the rest of the pipeline.
	ClaimAt int
	// Checked claims answer true or false instead of failing, and are read before
	// the statement that travelled with them.
	Checked bool
	// Refused is what every statement returns once the claim was refused.
	Refused error
	// Managed is what Commit and Rollback return: the owner ends the transaction.
	Managed error
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

	sent    bool
	tx      pgx.Tx // the transaction, once sent
	refused bool   // the claim was refused
	err     error  // why nothing more may be sent: the claim was refused or the send failed
}

// New returns a Tx that has sent nothing yet.
func New(cfg Config) *Tx { return &Tx{cfg: cfg} }

// Queued is a query for a prefix.
func Queued(sql string, args ...any) *pgx.QueuedQuery {
	return &pgx.QueuedQuery{SQL: sql, Arguments: args}
}

// Sent reports whether the prefix has been sent.
func (p *Tx) Sent() bool { return p.sent }

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
	if p.sent {
		if p.tx != nil {
			return p.tx.SendBatch(ctx, b), nil
		}
		return p.cfg.Via.SendBatch(ctx, b), nil
	}
	p.sent = true
	full := &pgx.Batch{}
	skip := len(p.cfg.Prefix)
	if p.cfg.Begin {
		full.BeginTx(pgx.TxOptions{})
		skip++
	}
	full.QueuedQueries = append(full.QueuedQueries, p.cfg.Prefix...)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	br := p.cfg.Via.SendBatch(ctx, full)
	if p.cfg.Begin {
		p.tx = br.Tx()
	}
	for i := range skip {
		claim := p.cfg.ClaimAt >= 0 && i == p.cfg.ClaimAt+boolInt(p.cfg.Begin)
		if p.cfg.Checked && claim {
			var ok bool
			if err := br.QueryRow().Scan(&ok); err != nil {
				_ = br.Close()
				p.err = err
				return nil, err
			}
			if !ok {
				_ = br.Close()
				p.refused, p.err = true, p.cfg.Refused
				return nil, p.err
			}
			continue
		}
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if claim && pgsql.Code(err) == pgsql.DivisionByZero {
				p.refused = true
				p.err = p.cfg.Refused
			} else {
				p.err = err
			}
			return nil, p.err
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

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

package ledger

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/shard"
)

// NewSharded returns a ledger on the shards of r, each migrated with [Migrate]: every
// call about one key runs on the shard r places its tenant on, so a tenant's records,
// and the business writes of Do's fn, stay on one PostgreSQL. Calls that take the
// caller's transaction run where it is: open it on r.Pool(tenant); one open on another
// shard is refused with a *shard.WrongShardError before anything runs. List, Stats and
// Purge run on every shard in turn; a shard that fails them does not stop the others,
// and the error names it.
func NewSharded(r *shard.Router, cfg *Config) (*Ledger, error) {
	if r == nil {
		return nil, errors.New("oncekit/ledger: NewSharded needs a router")
	}
	return newLedger(r, cfg)
}

// named names tenant's shard in err, on a ledger of several shards, when err came from
// the shard's server: PostgreSQL's error, a connection that failed or broke, or a lost
// answer. fn's own errors and the ledger's answers about a key are returned as they are.
func (l *Ledger) named(tenant string, err error) error {
	var (
		pgErr   *pgconn.PgError
		connErr *pgconn.ConnectError
		netErr  net.Error
	)
	if errors.As(err, &pgErr) || errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, io.ErrUnexpectedEOF) {
		return l.r.Name(tenant, err)
	}
	return err
}

// Router returns the router the ledger places tenants with; a ledger made by [New] has
// a router of one shard.
func (l *Ledger) Router() *shard.Router { return l.r }

// leasePool returns the pool of the lease's shard, once the lease is checked.
func (l *Ledger) leasePool(lease *Lease) (*pgxpool.Pool, error) {
	if err := l.checkLease(lease); err != nil {
		return nil, err
	}
	return l.r.Pool(lease.Scope.Tenant)
}

// onLease runs fn on the pool of the lease's shard.
func (l *Ledger) onLease(lease *Lease, fn func(q querier) error) error {
	pool, err := l.leasePool(lease)
	if err != nil {
		return err
	}
	return fn(pool)
}

// checkTx refuses, on a ledger of several shards, a caller's transaction that is not on
// tenant's shard: its record would land where the tenant's other calls cannot see it.
func (l *Ledger) checkTx(tx pgx.Tx, tenant string) error {
	if tx == nil {
		return nil
	}
	return l.r.Check(tenant, tx.Conn())
}

// checkLeaseTx is checkTx for the lease's tenant; a nil lease is left to the call,
// which refuses it.
func (l *Ledger) checkLeaseTx(tx pgx.Tx, lease *Lease) error {
	if lease == nil {
		return nil
	}
	return l.checkTx(tx, lease.Scope.Tenant)
}

// newestFirst orders records as List does: newest first, then by tenant, operation and
// key, descending. Records of two shards have different tenants; when they were also
// created in the same microsecond, their order is Go's byte order of the tenants,
// which a database collation other than "C" may not share.
func newestFirst(a, b Record) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(recordOrder(b), recordOrder(a))
}

func recordOrder(r Record) string {
	return r.Scope.Tenant + "\x00" + r.Scope.Operation + "\x00" + string(r.Key)
}

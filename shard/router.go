package shard

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Shard is one PostgreSQL cluster and its name.
type Shard struct {
	// Name names the shard in a [Picker]'s answers, in errors and in the oncekit
	// command's --shard.
	Name string
	// Pool is the shard's pool.
	Pool *pgxpool.Pool
}

// Picker names the shard of a tenant. It must answer the same for a tenant for as long
// as the tenant's records are kept (see "Placement" in the package documentation).
type Picker func(tenant string) (shard string, err error)

// ErrUnroutable is what an [*UnroutableError] matches with errors.Is.
var ErrUnroutable = errors.New("oncekit/shard: no shard for the tenant")

// UnroutableError reports a tenant that no shard takes: the picker placed it nowhere
// (Err says why), or named a shard the router lacks (Shard).
type UnroutableError struct {
	Tenant string
	Shard  string
	Err    error
}

func (e *UnroutableError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("oncekit/shard: no shard for tenant %q: %v", e.Tenant, e.Err)
	}
	return fmt.Sprintf("oncekit/shard: tenant %q is placed on shard %q, which the router lacks: give the router every shard its picker names", e.Tenant, e.Shard)
}

// Is reports whether target is [ErrUnroutable].
func (e *UnroutableError) Is(target error) bool { return target == ErrUnroutable }

// Unwrap returns the picker's error.
func (e *UnroutableError) Unwrap() error { return e.Err }

// ErrWrongShard is what a [*WrongShardError] matches with errors.Is.
var ErrWrongShard = errors.New("oncekit/shard: the transaction is on another shard than the tenant's")

// WrongShardError reports a transaction, given to a call about a tenant, that is open
// on a server other than the tenant's shard's: the record would land where a retry on
// the right shard cannot see it.
type WrongShardError struct {
	Tenant string
	// Shard is the tenant's shard.
	Shard string
}

func (e *WrongShardError) Error() string {
	return fmt.Sprintf("oncekit/shard: the transaction is not on tenant %q's shard %q: open it on the router's Pool(%q)", e.Tenant, e.Shard, e.Tenant)
}

// Is reports whether target is [ErrWrongShard].
func (e *WrongShardError) Is(target error) bool { return target == ErrWrongShard }

// Error is an error met on one shard of several, naming it. Calls on a router of
// several shards return their errors wrapped in one, so that an operator knows which
// server to look at; errors.Is and errors.As see through it.
type Error struct {
	// Shard is the shard's name.
	Shard string
	// Err is the error met there.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("shard %q: %v", e.Shard, e.Err) }

// Unwrap returns the error met on the shard.
func (e *Error) Unwrap() error { return e.Err }

// Name wraps err, met on tenant's shard, in an [*Error] naming that shard when the
// router has several; a nil err, an err that already names a shard, a router of one
// shard and a tenant that no shard takes leave err as it is.
func (r *Router) Name(tenant string, err error) error {
	if err == nil || len(r.shards) == 1 {
		return err
	}
	var named *Error
	if errors.As(err, &named) {
		return err
	}
	s, ferr := r.For(tenant)
	if ferr != nil {
		return err
	}
	return &Error{Shard: s.Name, Err: err}
}

// Router maps tenants to shards. It is safe for concurrent use.
type Router struct {
	shards []Shard
	index  map[string]int
	pick   Picker
	// ids are the shards' servers, as their pools' configurations name them.
	ids []serverID
}

// serverID names a server and a database, as a connection's configuration does.
type serverID struct {
	host     string
	port     uint16
	database string
}

func idOf(c *pgx.ConnConfig) serverID { return serverID{c.Host, c.Port, c.Database} }

// New returns a router over shards, which pick places tenants on. Each shard needs a
// pool and a name of its own; a nil pick is [Hash] over the shards' names.
func New(shards []Shard, pick Picker) (*Router, error) {
	if len(shards) == 0 {
		return nil, errors.New("oncekit/shard: New needs at least one shard")
	}
	r := &Router{shards: slices.Clone(shards), index: make(map[string]int, len(shards)), pick: pick}
	names := make([]string, len(shards))
	for i, s := range shards {
		if s.Pool == nil {
			return nil, fmt.Errorf("oncekit/shard: shard %q has no pool", s.Name)
		}
		if _, dup := r.index[s.Name]; dup {
			return nil, fmt.Errorf("oncekit/shard: two shards are named %q: give each a name of its own", s.Name)
		}
		r.index[s.Name] = i
		names[i] = s.Name
		r.ids = append(r.ids, idOf(s.Pool.Config().ConnConfig))
	}
	if r.pick == nil {
		r.pick = Hash(names...)
	}
	return r, nil
}

// Single returns a router that sends every tenant to pool, as a shard named "".
func Single(pool *pgxpool.Pool) *Router {
	return &Router{shards: []Shard{{Pool: pool}}, index: map[string]int{"": 0}}
}

// For returns the shard of tenant.
func (r *Router) For(tenant string) (Shard, error) {
	if r.pick == nil {
		return r.shards[0], nil
	}
	name, err := r.pick(tenant)
	if err != nil {
		return Shard{}, &UnroutableError{Tenant: tenant, Err: err}
	}
	i, ok := r.index[name]
	if !ok {
		return Shard{}, &UnroutableError{Tenant: tenant, Shard: name}
	}
	return r.shards[i], nil
}

// Pool returns the pool of tenant's shard: the pool to open a transaction on for the
// ledger's, the inbox's and the outbox's calls that take one.
func (r *Router) Pool(tenant string) (*pgxpool.Pool, error) {
	s, err := r.For(tenant)
	return s.Pool, err
}

// Check returns a [*WrongShardError] when conn, such as a transaction's (tx.Conn()), is
// not connected to tenant's shard, as its configuration's host, port and database say;
// a router of one shard checks nothing.
func (r *Router) Check(tenant string, conn *pgx.Conn) error {
	if len(r.shards) == 1 || conn == nil {
		return nil
	}
	s, err := r.For(tenant)
	if err != nil {
		return err
	}
	if idOf(conn.Config()) != r.ids[r.index[s.Name]] {
		return &WrongShardError{Tenant: tenant, Shard: s.Name}
	}
	return nil
}

// Shards returns the router's shards, in the order given to [New].
func (r *Router) Shards() []Shard { return slices.Clone(r.shards) }

// Each runs fn on every shard in turn, all of them whatever some return, and joins
// their errors, each naming its shard when the router has several.
func (r *Router) Each(fn func(s Shard) error) error {
	var errs []error
	for _, s := range r.shards {
		if err := fn(s); err != nil {
			if len(r.shards) > 1 {
				err = &Error{Shard: s.Name, Err: err}
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Shard returns the shard named name.
func (r *Router) Shard(name string) (Shard, bool) {
	i, ok := r.index[name]
	if !ok {
		return Shard{}, false
	}
	return r.shards[i], true
}

// Hash places tenants on the shards named by rendezvous hashing: each tenant goes to
// the name that scores highest for it: 64-bit FNV-1a of the name, a zero byte and the
// tenant, mixed by MurmurHash3's finalizer. The placement depends on the
// set of names alone, and stays the same across oncekit's versions.
func Hash(names ...string) Picker {
	names = slices.Clone(names)
	return func(tenant string) (string, error) {
		if len(names) == 0 {
			return "", errors.New("no shard names were given to Hash")
		}
		best, bestScore := "", uint64(0)
		for i, n := range names {
			h := fnv.New64a()
			h.Write([]byte(n))
			h.Write([]byte{0})
			h.Write([]byte(tenant))
			if s := mix(h.Sum64()); i == 0 || s > bestScore {
				best, bestScore = n, s
			}
		}
		return best, nil
	}
}

// mix spreads the bits of an FNV-1a hash, whose high bits follow its last bytes weakly,
// over the whole word (MurmurHash3's finalizer).
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Map places the tenants it names on their shards, and the rest with fallback; a nil
// fallback leaves them unplaced, and the calls of such a tenant fail with an
// [*UnroutableError].
func Map(tenants map[string]string, fallback Picker) Picker {
	m := make(map[string]string, len(tenants))
	for t, s := range tenants {
		m[t] = s
	}
	return func(tenant string) (string, error) {
		if s, ok := m[tenant]; ok {
			return s, nil
		}
		if fallback == nil {
			return "", errors.New("the map does not name it, and has no fallback")
		}
		return fallback(tenant)
	}
}

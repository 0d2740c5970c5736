package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/internal/config"
	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/shard"
)

// Defaults of [Config] and the per-call options.
const (
	// SchemaDefault is the schema the ledger's table lives in: the schema of every
	// oncekit table.
	SchemaDefault = config.SchemaDefault
	// RetentionDefault is how long a record is kept: long enough to outlive client
	// retries, broker redelivery, webhook replay and operator replays of a week-long
	// business process. Set a longer one per operation for settlement-length horizons.
	RetentionDefault = 30 * 24 * time.Hour
	// LeaseDefault is how long an external-effect claim is owned before another attempt
	// may take it over.
	LeaseDefault = 5 * time.Minute
	// MaxBodyDefault is the largest stored result body, in bytes.
	MaxBodyDefault = 1 << 20
	// MaxKeyLenLimit is the largest [Config].MaxKeyLen: with the longest tenant and
	// operation ([keys.MaxScopeLen] each) a record's primary key still fits one index
	// entry of PostgreSQL's B-tree (2,704 bytes).
	MaxKeyLenLimit = 2048
	// MaxWait is the longest wait for a concurrent duplicate: PostgreSQL's longest
	// lock_timeout (2^31-1 ms, about 24.8 days). Longer waits are cut to it.
	MaxWait = maxLockTimeout
	// NoWait, or any negative duration, means "do not wait" wherever oncekit takes a
	// wait: ledger.DoOpts.Wait and ClaimOpts.Wait, activity.Opts.Wait, the Wait of the
	// HTTP middleware and the webhook receiver, webhook.Config.ReadSlotWait. Zero always
	// means the default, which each field documents; the ledger's own waits default to
	// none at all.
	NoWait = time.Duration(-1)
)

// TestConfig holds the knobs of [Config] that exist for tests.
type TestConfig struct {
	// NowFunc, when set, replaces the database clock for expiry and leases, and the
	// process's clock for the time Do and DoTx record, for tests that move time. Left
	// nil, expiry and leases follow the database's clock, which every node shares.
	NowFunc func() time.Time
}

// Beginner starts a transaction. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a [Ledger]. A nil *Config means all defaults.
type Config struct {
	// Schema is the schema holding the ledger's table, as given to [Migrate].
	// Defaults to [SchemaDefault].
	Schema string
	// Retention is how long records are kept when the operation has no entry in
	// OperationRetention. Defaults to [RetentionDefault].
	Retention time.Duration
	// OperationRetention sets the retention of individual operations, by operation name,
	// so each operation keeps its records for its own replay horizon. Defaults to none.
	OperationRetention map[string]time.Duration
	// Lease is how long an external-effect claim is owned. Defaults to [LeaseDefault].
	Lease time.Duration
	// MaxBodyBytes is the largest result body the ledger stores; a larger one is refused
	// with a [*BodyTooLargeError] and nothing is written. Defaults to [MaxBodyDefault].
	MaxBodyBytes int
	// MaxKeyLen is the longest key accepted, in bytes, at most [MaxKeyLenLimit].
	// Defaults to [keys.MaxLenDefault].
	MaxKeyLen int
	// MeterProvider receives the ledger's metrics (see "Telemetry" in the package
	// documentation). Defaults to none: no metric is recorded.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a span per ledger call, a child of the caller's span.
	// Defaults to none.
	TracerProvider trace.TracerProvider
	// Logger receives a line per take-over of an external claim whose lease ran out and
	// per purge. Defaults to discarding them.
	Logger *slog.Logger
	// Test holds knobs for tests only; production code leaves it zero.
	Test TestConfig
}

// Ledger is the dedup ledger: records keyed by (tenant, operation, key) in PostgreSQL.
// It is safe for concurrent use.
type Ledger struct {
	r   *shard.Router
	cfg Config
	q   queries
	tel *telemetry
}

// New returns a ledger on pool. The schema must have been migrated with [Migrate].
func New(pool *pgxpool.Pool, cfg *Config) (*Ledger, error) {
	if pool == nil {
		return nil, errors.New("oncekit/ledger: New needs a pool")
	}
	return newLedger(shard.Single(pool), cfg)
}

func newLedger(r *shard.Router, cfg *Config) (*Ledger, error) {
	c := config.Of(cfg)
	c.Schema = config.Or(c.Schema, SchemaDefault)
	c.Retention = config.Or(c.Retention, RetentionDefault)
	c.Lease = config.Or(c.Lease, LeaseDefault)
	c.MaxBodyBytes = config.Or(c.MaxBodyBytes, MaxBodyDefault)
	c.MaxKeyLen = config.Or(c.MaxKeyLen, keys.MaxLenDefault)
	if c.Retention < 0 || c.Lease < 0 || c.MaxBodyBytes < 0 || c.MaxKeyLen < 0 {
		return nil, errors.New("oncekit/ledger: Config durations and limits must not be negative")
	}
	if c.MaxKeyLen > MaxKeyLenLimit {
		return nil, fmt.Errorf("oncekit/ledger: Config.MaxKeyLen %d is over MaxKeyLenLimit (%d), the longest key the ledger's index can hold", c.MaxKeyLen, MaxKeyLenLimit)
	}
	for op, d := range c.OperationRetention {
		if d <= 0 {
			return nil, fmt.Errorf("oncekit/ledger: OperationRetention[%q] must be positive", op)
		}
	}
	l := &Ledger{r: r, cfg: c, q: newQueries(c.Schema)}
	var err error
	if l.tel, err = newTelemetry(&c, l.pendingCounts); err != nil {
		return nil, fmt.Errorf("oncekit/ledger: create the instruments: %w", err)
	}
	return l, nil
}

// Schema returns the schema the ledger's table lives in.
func (l *Ledger) Schema() string { return l.cfg.Schema }

func (l *Ledger) retention(op string, override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	if d, ok := l.cfg.OperationRetention[op]; ok {
		return d
	}
	return l.cfg.Retention
}

// recordedAt is the time a record of Do is written with: the stubbed time, or the
// process's clock, to the microsecond PostgreSQL keeps. The record's expiry is reckoned
// from it, but never from before the database's clock at the transaction's start.
func (l *Ledger) recordedAt() time.Time {
	if l.cfg.Test.NowFunc != nil {
		return l.cfg.Test.NowFunc().Truncate(time.Microsecond)
	}
	return time.Now().Truncate(time.Microsecond)
}

// now returns the stubbed time, or nil so that SQL uses the database's now().
func (l *Ledger) now() *time.Time {
	if l.cfg.Test.NowFunc == nil {
		return nil
	}
	t := l.cfg.Test.NowFunc()
	return &t
}

func (l *Ledger) validate(scope keys.Scope, key keys.Key, fp keys.Fingerprint) error {
	if err := scope.Validate(); err != nil {
		return err
	}
	if err := key.ValidateLen(l.cfg.MaxKeyLen); err != nil {
		return err
	}
	if err := fp.Validate(); err != nil {
		return fmt.Errorf("oncekit/ledger: Intent.Fingerprint: %w", err)
	}
	return nil
}

func (l *Ledger) checkResponse(resp Response) error {
	if len(resp.Body) > l.cfg.MaxBodyBytes {
		return &BodyTooLargeError{Size: len(resp.Body), Limit: l.cfg.MaxBodyBytes}
	}
	if i := checkText(resp.ResourceRef); i >= 0 {
		return &InvalidResponseError{Field: "ResourceRef", Offset: i}
	}
	return nil
}

// Get returns the record of key in scope, expired or not, for operators and tests. It
// returns [ErrNotFound] when there is none.
func (l *Ledger) Get(ctx context.Context, scope keys.Scope, key keys.Key) (*Record, error) {
	pool, err := l.r.Pool(scope.Tenant)
	if err != nil {
		return nil, err
	}
	rec, err := l.get(ctx, pool, scope, key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		err = l.named(scope.Tenant, err)
	}
	return rec, err
}

// GetTx is [Ledger.Get] inside the caller's transaction.
func (l *Ledger) GetTx(ctx context.Context, tx pgx.Tx, scope keys.Scope, key keys.Key) (*Record, error) {
	if err := l.checkTx(tx, scope.Tenant); err != nil {
		return nil, err
	}
	return l.get(ctx, tx, scope, key)
}

func (l *Ledger) get(ctx context.Context, q querier, scope keys.Scope, key keys.Key) (*Record, error) {
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	if err := key.ValidateLen(l.cfg.MaxKeyLen); err != nil {
		return nil, err
	}
	r := &Record{Scope: scope, Key: key}
	var sc recordScan
	var origin [4]*string
	dest := append(sc.dest(r), &origin[0], &origin[1], &origin[2], &origin[3])
	err := q.QueryRow(ctx, l.q.get, scope.Tenant, scope.Operation, string(key), l.now()).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	sc.finish(r)
	r.Origin = Origin{WorkflowID: deref(origin[0]), RunID: deref(origin[1]), WorkflowType: deref(origin[2]), ActivityType: deref(origin[3])}
	return r, nil
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/shard"
)

// NewSharded returns an outbox on the shards of r, each migrated. Enqueue writes in the
// caller's transaction, on whichever shard that is, so an event commits with the
// tenant's business writes. Each shard needs a dispatcher of its own, made on
// [Outbox.Shard]; one shard that is down then holds back its own events only. Get,
// Retry, ListDead, Dead, RetryDead, Stats, Purgeable and Purge run on every shard in
// turn.
func NewSharded(r *shard.Router, cfg *Config) (*Outbox, error) {
	if r == nil {
		return nil, errors.New("oncekit/outbox: NewSharded needs a router")
	}
	return newOutbox(r, cfg)
}

// Shard returns the outbox of the shard named name, on which a [Dispatcher] runs: the
// outbox itself when it has one shard of that name.
func (o *Outbox) Shard(name string) (*Outbox, error) {
	if o.shards == nil && o.name == name {
		return o, nil
	}
	for _, v := range o.shards {
		if v.name == name {
			return v, nil
		}
	}
	return nil, fmt.Errorf("oncekit/outbox: no shard named %q", name)
}

// each runs fn on the outbox of every shard (o itself when it has one) through the
// router's Each, which runs them all and names each shard that failed.
func (o *Outbox) each(fn func(v *Outbox) error) error {
	if o.shards == nil {
		return fn(o)
	}
	return o.r.Each(func(s shard.Shard) error {
		v, err := o.Shard(s.Name)
		if err != nil {
			return err
		}
		return fn(v)
	})
}

// oldestDead gathers what list finds on every shard and keeps the limit oldest.
func (o *Outbox) oldestDead(limit int, list func(v *Outbox) ([]DeadEvent, error)) ([]DeadEvent, error) {
	dead := []DeadEvent{}
	err := o.each(func(v *Outbox) error {
		evs, err := list(v)
		dead = append(dead, evs...)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(dead, func(a, b DeadEvent) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return dead[:min(len(dead), limit)], nil
}

// retryDeadAcross is RetryDead on several shards: the events named by IDs must all be
// dead somewhere before any is retried; then each shard retries its own in a
// transaction of its own.
func (o *Outbox) retryDeadAcross(ctx context.Context, c RetryDeadOpts) ([]uuid.UUID, error) {
	perShard := map[*Outbox][]uuid.UUID{}
	if len(c.IDs) > 0 {
		var found []uuid.UUID
		err := o.each(func(v *Outbox) error {
			rows, err := v.pool.Query(ctx, `SELECT id FROM `+v.t+` WHERE state = 'dead' AND id = ANY ($1::uuid[])`, c.IDs)
			if err != nil {
				return err
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			perShard[v] = ids
			found = append(found, ids...)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("oncekit/outbox: retry dead events: %w", err)
		}
		if len(found) != len(c.IDs) {
			nd := notDead(c.IDs, found, func(id uuid.UUID) uuid.UUID { return id })
			var exist []uuid.UUID
			err := o.each(func(v *Outbox) error {
				rows, err := v.pool.Query(ctx, `SELECT id FROM `+v.t+` WHERE id = ANY ($1::uuid[])`, c.IDs)
				if err != nil {
					return err
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
				exist = append(exist, ids...)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("oncekit/outbox: retry dead events: %w", err)
			}
			missing := notDead(c.IDs, exist, func(id uuid.UUID) uuid.UUID { return id })
			nd.Missing, nd.MissingCount = missing.IDs, missing.Count
			return nil, nd
		}
	}
	retried := []uuid.UUID{}
	err := o.each(func(v *Outbox) error {
		vc := c
		if len(c.IDs) > 0 {
			if vc.IDs = perShard[v]; len(vc.IDs) == 0 {
				return nil
			}
		}
		ids, err := v.RetryDead(ctx, &vc)
		retried = append(retried, ids...)
		return err
	})
	return retried, err
}

package cache

import (
	"context"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.HashFinder = (*Store)(nil)

// GetByHash implements storage.HashFinder when the wrapped store does
// (none found otherwise).
func (c *Store) GetByHash(ctx context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	if f, ok := c.Store.(storage.HashFinder); ok {
		return f.GetByHash(ctx, hash, withBody)
	}
	return nil, nil
}

// DeleteByHash implements storage.HashFinder, dropping the cached records
// too.
func (c *Store) DeleteByHash(ctx context.Context, hash string) (int, error) {
	c.dropHash(hash)
	if f, ok := c.Store.(storage.HashFinder); ok {
		return f.DeleteByHash(ctx, hash)
	}
	return 0, nil
}

// dropHash drops the cached records whose key's Hash is hash.
func (c *Store) dropHash(hash string) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for key := range sh.items {
			if key.Hash() == hash {
				delete(sh.items, key)
			}
		}
		sh.mu.Unlock()
	}
}

var _ storage.OutcomeUnknownKeeper = (*Store)(nil)

// ListOutcomeUnknown implements storage.OutcomeUnknownKeeper when the
// wrapped store does (nothing otherwise).
func (c *Store) ListOutcomeUnknown(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if k, ok := c.Store.(storage.OutcomeUnknownKeeper); ok {
		return k.ListOutcomeUnknown(ctx, after, limit)
	}
	return nil, nil
}

// ReleaseOutcomeUnknown implements storage.OutcomeUnknownKeeper when the
// wrapped store does, dropping the cached records of hash (an
// outcome-unknown record is cached as any completed one; another
// instance's cache keeps it until the entry's own TTL ends).
func (c *Store) ReleaseOutcomeUnknown(ctx context.Context, hash string) (int, error) {
	c.dropHash(hash)
	if k, ok := c.Store.(storage.OutcomeUnknownKeeper); ok {
		return k.ReleaseOutcomeUnknown(ctx, hash)
	}
	return 0, nil
}

var _ storage.Pinger = (*Store)(nil)

// Ping implements storage.Pinger when the wrapped store does (nil
// otherwise).
func (c *Store) Ping(ctx context.Context) error {
	if p, ok := c.Store.(storage.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

var _ storage.DurabilityReporter = (*Store)(nil)

// Durability implements storage.DurabilityReporter when the wrapped store
// does (nil, no facts, otherwise).
func (c *Store) Durability(ctx context.Context) (any, error) {
	if d, ok := c.Store.(storage.DurabilityReporter); ok {
		return d.Durability(ctx)
	}
	return nil, nil
}

var _ storage.KeyLimiter = (*Store)(nil)

// MaxKeyLength implements storage.KeyLimiter for the wrapped store: 0
// (no bound) when it has none.
func (c *Store) MaxKeyLength() int {
	if kl, ok := c.Store.(storage.KeyLimiter); ok {
		return kl.MaxKeyLength()
	}
	return 0
}

var _ storage.InFlightLister = (*Store)(nil)

// ListInFlight implements storage.InFlightLister when the wrapped store
// does (nothing otherwise): records in flight are never cached.
func (c *Store) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if l, ok := c.Store.(storage.InFlightLister); ok {
		return l.ListInFlight(ctx, after, limit)
	}
	return nil, nil
}

// Package cache keeps completed idempotency records in process memory in
// front of a shared store (Redis, PostgreSQL), so that a replay on an
// instance that has seen the record recently costs no round trip.
//
// It is safe because a completed record never changes: it only expires or
// is deleted. Expiry is honoured (entries never outlive the record). A
// deletion through this store drops the entry at once, but a deletion on
// another instance is seen here only when the entry's own TTL ends: keep
// the TTL short. In-flight and absent keys are never cached, so
// reservations, conflicts and takeovers always reach the store.
package cache

import (
	"bytes"
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Options configures a cache.
type Options struct {
	// MaxEntries bounds the records kept; the oldest go first.
	MaxEntries int
	// TTL bounds how long an entry is served without asking the store.
	TTL time.Duration
}

const shards = 16

// Store is a storage.Store with a cache of completed records.
type Store struct {
	storage.Store
	ttl    time.Duration
	seed   maphash.Seed
	shards [shards]shard
}

type shard struct {
	mu    sync.Mutex
	max   int
	items map[storage.Key]*entry
	order []storage.Key // insertion order, oldest first, for eviction
}

type entry struct {
	rec   *storage.Record
	until time.Time
}

// waitingStore is a Store whose backend can notify waiters.
type waitingStore struct {
	*Store
	storage.Waiter
}

// renewingStore is a Store whose backend renews leases in batches; leases
// are never cached, so the batches go to the backend as they are.
type renewingStore struct {
	*Store
	storage.BatchRenewer
}

// waitingRenewingStore is both.
type waitingRenewingStore struct {
	*Store
	storage.Waiter
	storage.BatchRenewer
}

// New wraps store. The result implements storage.Waiter and
// storage.BatchRenewer when store does.
func New(store storage.Store, opts Options) storage.Store {
	per := max(1, opts.MaxEntries/shards)
	c := &Store{Store: store, ttl: opts.TTL, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].items = make(map[storage.Key]*entry)
	}
	w, waits := store.(storage.Waiter)
	b, batches := store.(storage.BatchRenewer)
	switch {
	case waits && batches:
		return waitingRenewingStore{Store: c, Waiter: w, BatchRenewer: b}
	case waits:
		return waitingStore{Store: c, Waiter: w}
	case batches:
		return renewingStore{Store: c, BatchRenewer: b}
	}
	return c
}

// Unwrap returns the wrapped store.
func (c *Store) Unwrap() storage.Store { return c.Store }

func (c *Store) shardFor(key storage.Key) *shard {
	return &c.shards[maphash.Comparable(c.seed, key)%shards]
}

// Reserve answers from the cache when it holds the completed record of
// key, and otherwise asks the store, keeping a completed record it returns.
func (c *Store) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	sh := c.shardFor(key)
	now := time.Now()
	sh.mu.Lock()
	e := sh.items[key]
	if e != nil && now.After(e.until) {
		delete(sh.items, key)
		e = nil
	}
	sh.mu.Unlock()
	if e != nil {
		if !bytes.Equal(e.rec.Fingerprint, fp) {
			if len(e.rec.Detail) == 0 {
				return storage.Reservation{Outcome: storage.Mismatch}, nil
			}
			return storage.Reservation{Outcome: storage.Mismatch, Record: &storage.Record{Detail: e.rec.Detail}}, nil
		}
		return storage.Reservation{Outcome: storage.Replay, Record: e.rec}, nil
	}
	res, err := c.Store.Reserve(ctx, key, fp, lease)
	if err == nil && res.Outcome == storage.Replay && res.Record != nil {
		c.keep(sh, key, res.Record, now)
	}
	return res, err
}

func (c *Store) keep(sh *shard, key storage.Key, rec *storage.Record, now time.Time) {
	until := now.Add(c.ttl)
	if rec.ExpiresAt.Before(until) {
		until = rec.ExpiresAt
	}
	if !until.After(now) {
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.items[key]; !ok {
		for len(sh.items) >= sh.max && len(sh.order) > 0 {
			delete(sh.items, sh.order[0])
			sh.order = sh.order[1:]
		}
		sh.order = append(sh.order, key)
	}
	sh.items[key] = &entry{rec: rec, until: until}
	if len(sh.order) > 2*sh.max { // keys deleted meanwhile: compact
		live := sh.order[:0]
		for _, k := range sh.order {
			if _, ok := sh.items[k]; ok {
				live = append(live, k)
			}
		}
		sh.order = live
	}
}

// Delete drops the cached record and deletes it in the store.
func (c *Store) Delete(ctx context.Context, key storage.Key) error {
	sh := c.shardFor(key)
	sh.mu.Lock()
	delete(sh.items, key)
	sh.mu.Unlock()
	return c.Store.Delete(ctx, key)
}

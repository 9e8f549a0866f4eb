package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.HashFinder = (*Store)(nil)

// GetByHash implements storage.HashFinder: a key name is the prefix and
// the hex of the Digest's first 16 bytes, of which the Hash is the first
// half, so the records are found with SCAN on every primary.
func (s *Store) GetByHash(ctx context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	names, err := s.namesByHash(ctx, hash)
	if err != nil {
		return nil, err
	}
	var out []*storage.Record
	for _, name := range names {
		rec, err := s.getName(ctx, name, withBody)
		switch {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			out = append(out, rec)
		}
	}
	return out, nil
}

// DeleteByHash implements storage.HashFinder.
func (s *Store) DeleteByHash(ctx context.Context, hash string) (int, error) {
	names, err := s.namesByHash(ctx, hash)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		switch err := s.deleteName(ctx, name); {
		case errors.Is(err, storage.ErrNotFound):
		case err != nil:
			return n, err
		default:
			n++
		}
	}
	return n, nil
}

// namesByHash returns the key names of the store that start with hash.
func (s *Store) namesByHash(ctx context.Context, hash string) ([]string, error) {
	if s.invalid != nil {
		return nil, fmt.Errorf("redis scan: %w", s.invalid)
	}
	if len(hash) != storage.HashLen || !isHex(hash) {
		return nil, nil
	}
	pattern := escapeGlob(s.prefix) + hash + "*"
	var mu sync.Mutex
	var names []string
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			names = append(names, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	if err := s.scanPrimaries(ctx, scan); err != nil {
		return nil, err
	}
	return names, nil
}

// scanPrimaries runs scan on every primary that holds keys of the store:
// each master of a cluster (concurrently, so scan must lock what it
// shares), else the one server. SCAN only sees the node it is sent to.
func (s *Store) scanPrimaries(ctx context.Context, scan func(context.Context, goredis.Cmdable) error) error {
	var err error
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return fmt.Errorf("redis scan: %w", s.classify(err))
	}
	return nil
}

// escapeGlob escapes the characters SCAN's MATCH treats as a pattern.
func escapeGlob(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(b)
}

// isHex reports whether s holds lower-case hex digits only, so that it
// cannot carry SCAN pattern characters.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

var _ storage.InFlightLister = (*Store)(nil)

// scanBatch is how many key names one SCAN step asks for, and so how many
// records one pipelined look at their state covers.
const scanBatch = 1000

// ListInFlight implements storage.InFlightLister: SCAN on every primary,
// each batch of names looked at in one pipeline (HEXISTS of the lease
// token, which only a record in flight has), keeping the limit smallest
// key hashes after after; those are then read in full. Memory is bounded
// by limit and the batch, whatever the store holds.
func (s *Store) ListInFlight(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	probe := func(ctx context.Context, pipe goredis.Pipeliner, name string) func() bool {
		held := pipe.HExists(ctx, name, "t")
		return held.Val
	}
	return s.list(ctx, after, limit, probe, func(rec *storage.Record) bool { return rec.State == storage.InFlight })
}

var _ storage.OutcomeUnknownKeeper = (*Store)(nil)

// ListOutcomeUnknown implements storage.OutcomeUnknownKeeper as
// ListInFlight lists, the pipeline reading each record's head (its
// encoding says whether it is marked: storage.EncodedOutcomeUnknown).
func (s *Store) ListOutcomeUnknown(ctx context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	probe := func(ctx context.Context, pipe goredis.Pipeliner, name string) func() bool {
		head := pipe.HGet(ctx, name, "h")
		return func() bool { return storage.EncodedOutcomeUnknown([]byte(head.Val())) }
	}
	return s.list(ctx, after, limit, probe, func(rec *storage.Record) bool {
		return rec.State == storage.Completed && rec.Response != nil && rec.Response.OutcomeUnknown
	})
}

// ReleaseOutcomeUnknown implements storage.OutcomeUnknownKeeper: one
// script per name checks that the record is live and marked, and deletes
// it.
func (s *Store) ReleaseOutcomeUnknown(ctx context.Context, hash string) (int, error) {
	names, err := s.namesByHash(ctx, hash)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		v, err := s.runKey(ctx, releaseUnknownScript, name)
		if err != nil {
			return n, fmt.Errorf("redis release: %w", err)
		}
		if v == int64(1) {
			n++
		}
	}
	return n, nil
}

// probe adds to pipe what tells whether the record under name is one to
// list, and returns what reads the answer once the pipeline ran.
type probe func(ctx context.Context, pipe goredis.Pipeliner, name string) func() bool

// list pages through the records that probe picks and keep keeps once
// read in full.
func (s *Store) list(ctx context.Context, after string, limit int, probe probe, keep func(*storage.Record) bool) ([]storage.HashedRecord, error) {
	if s.invalid != nil {
		return nil, fmt.Errorf("redis scan: %w", s.invalid)
	}
	if limit <= 0 {
		return nil, nil
	}
	// A name the scan found may no longer be a record to list when it is
	// read (released, or a lease that lapsed but whose key Redis keeps a
	// while): a short page would read as the last one, so the page is
	// filled from the names after it.
	var out []storage.HashedRecord
	for len(out) < limit {
		want := limit - len(out)
		names, err := s.probedNames(ctx, after, want, probe)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			rec, err := s.getName(ctx, name, false)
			switch {
			case errors.Is(err, storage.ErrNotFound):
				// Released, deleted or lapsed since the scan; one completed
				// since is left out below.
			case err != nil:
				return nil, err
			case keep(rec):
				out = append(out, storage.HashedRecord{KeyHash: s.hashOf(name), Record: rec})
			}
		}
		if len(names) < want {
			break // no more names after these
		}
		after = s.hashOf(names[len(names)-1])
	}
	return out, nil
}

// probedNames returns the names of up to limit records that probe picks
// whose key hash sorts after after, in that order.
func (s *Store) probedNames(ctx context.Context, after string, limit int, probe probe) ([]string, error) {
	pattern := escapeGlob(s.prefix) + "*"
	var mu sync.Mutex
	// The page so far, sorted by name: the key hash is the first half of
	// the hex after the prefix, so that is also by key hash.
	var names []string
	keep := func(batch []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range batch {
			if len(names) == limit && s.hashOf(name) >= s.hashOf(names[limit-1]) {
				continue
			}
			at, found := slices.BinarySearch(names, name)
			if found {
				continue // SCAN may return a name more than once
			}
			names = slices.Insert(names, at, name)
			if len(names) > limit {
				names = names[:limit]
			}
		}
	}
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		var cursor uint64
		for {
			batch, next, err := c.Scan(ctx, cursor, pattern, scanBatch).Result()
			if err != nil {
				return err
			}
			batch = slices.DeleteFunc(batch, func(name string) bool {
				// A record's name is the prefix and 32 hex digits (keyName);
				// anything else under the prefix (a waiter's channel is not
				// a key) is not one.
				return len(name) != len(s.prefix)+32 || !isHex(name[len(s.prefix):]) || s.hashOf(name) <= after
			})
			if len(batch) > 0 {
				pipe := c.Pipeline()
				picked := make([]func() bool, len(batch))
				for i, name := range batch {
					picked[i] = probe(ctx, pipe, name)
				}
				if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
					return err
				}
				kept := batch[:0]
				for i, name := range batch {
					if picked[i]() {
						kept = append(kept, name)
					}
				}
				keep(kept)
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	if err := s.scanPrimaries(ctx, scan); err != nil {
		return nil, err
	}
	return names, nil
}

// hashOf returns the key hash of a record's name: the hex after the
// prefix begins with it.
func (s *Store) hashOf(name string) string {
	return name[len(s.prefix) : len(s.prefix)+storage.HashLen]
}

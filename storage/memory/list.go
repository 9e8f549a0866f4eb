package memory

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.InFlightLister = (*Store)(nil)

// ListInFlight implements storage.InFlightLister by walking every shard,
// keeping the limit smallest key hashes after after: memory bounded by
// limit, whatever the store holds.
func (s *Store) ListInFlight(_ context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	return s.list(after, limit, func(e *entry) bool { return e.resp == nil }, func(e *entry) (*storage.Record, error) {
		return &storage.Record{
			Fingerprint: e.fp,
			State:       storage.InFlight,
			Token:       e.token,
			CreatedAt:   s.at(e.created),
			ExpiresAt:   s.at(e.expires),
		}, nil
	})
}

var _ storage.OutcomeUnknownKeeper = (*Store)(nil)

// ListOutcomeUnknown implements storage.OutcomeUnknownKeeper, as
// ListInFlight lists.
func (s *Store) ListOutcomeUnknown(_ context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	return s.list(after, limit, func(e *entry) bool { return storage.EncodedOutcomeUnknown(e.resp) }, func(e *entry) (*storage.Record, error) {
		return s.completed(e, false)
	})
}

// list walks every shard, keeping the limit smallest key hashes after
// after of the live records that match: memory bounded by limit,
// whatever the store holds. record makes each kept record (under its
// shard's lock).
func (s *Store) list(after string, limit int, match func(*entry) bool, record func(*entry) (*storage.Record, error)) ([]storage.HashedRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	var page []storage.HashedRecord
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, e := range sh.m {
			if !match(e) || !e.live(now) {
				continue
			}
			kh := hex.EncodeToString(id[:storage.HashLen/2])
			if kh <= after || len(page) == limit && kh >= page[limit-1].KeyHash {
				continue
			}
			rec, err := record(e)
			if err != nil {
				sh.mu.Unlock()
				return nil, fmt.Errorf("memory: list: %w", err)
			}
			at, _ := slices.BinarySearchFunc(page, kh, func(r storage.HashedRecord, kh string) int { return strings.Compare(r.KeyHash, kh) })
			page = slices.Insert(page, at, storage.HashedRecord{KeyHash: kh, Record: rec})
			if len(page) > limit {
				page = page[:limit]
			}
		}
		sh.mu.Unlock()
	}
	return page, nil
}

package memory

import (
	"context"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.InFlightLister = (*Store)(nil)

// ListInFlight implements storage.InFlightLister by walking every shard,
// keeping the limit smallest key hashes after after: memory bounded by
// limit, whatever the store holds.
func (s *Store) ListInFlight(_ context.Context, after string, limit int) ([]storage.HashedRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	var page []storage.HashedRecord
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, e := range sh.m {
			if e.resp != nil || !e.live(now) {
				continue
			}
			kh := hex.EncodeToString(id[:storage.HashLen/2])
			if kh <= after || len(page) == limit && kh >= page[limit-1].KeyHash {
				continue
			}
			rec := storage.HashedRecord{KeyHash: kh, Record: &storage.Record{
				Fingerprint: e.fp,
				State:       storage.InFlight,
				Token:       e.token,
				CreatedAt:   s.at(e.created),
				ExpiresAt:   s.at(e.expires),
			}}
			at, _ := slices.BinarySearchFunc(page, kh, func(r storage.HashedRecord, kh string) int { return strings.Compare(r.KeyHash, kh) })
			page = slices.Insert(page, at, rec)
			if len(page) > limit {
				page = page[:limit]
			}
		}
		sh.mu.Unlock()
	}
	return page, nil
}

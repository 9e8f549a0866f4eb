package memory

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.HashFinder = (*Store)(nil)

// GetByHash implements storage.HashFinder by walking the records of one
// shard: the store keeps records by the key's Digest, whose first bytes
// the Hash is.
func (s *Store) GetByHash(_ context.Context, hash string, withBody bool) ([]*storage.Record, error) {
	var out []*storage.Record
	var err error
	s.eachByHash(hash, func(sh *shard, id recordID, e *entry) {
		if e.resp != nil {
			rec, cerr := s.completed(e, withBody)
			if cerr != nil {
				err = cmp.Or(err, fmt.Errorf("memory: get by hash: %w", cerr))
				return
			}
			out = append(out, rec)
			return
		}
		out = append(out, &storage.Record{
			Fingerprint: e.fp,
			State:       storage.InFlight,
			Token:       e.token,
			CreatedAt:   s.at(e.created),
			ExpiresAt:   s.at(e.expires),
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteByHash implements storage.HashFinder.
func (s *Store) DeleteByHash(_ context.Context, hash string) (int, error) {
	n := 0
	s.eachByHash(hash, func(sh *shard, id recordID, e *entry) {
		s.remove(sh, id, e)
		n++
	})
	return n, nil
}

// ReleaseOutcomeUnknown implements storage.OutcomeUnknownKeeper: each
// record is checked and removed under its shard's lock.
func (s *Store) ReleaseOutcomeUnknown(_ context.Context, hash string) (int, error) {
	n := 0
	s.eachByHash(hash, func(sh *shard, id recordID, e *entry) {
		if storage.EncodedOutcomeUnknown(e.resp) {
			s.remove(sh, id, e)
			n++
		}
	})
	return n, nil
}

// eachByHash calls fn, holding the shard's lock, for each live record
// whose key's Hash is hash.
func (s *Store) eachByHash(hash string, fn func(*shard, recordID, *entry)) {
	prefix, err := hex.DecodeString(hash)
	if err != nil || len(prefix) != storage.HashLen/2 || hex.EncodeToString(prefix) != hash {
		return
	}
	// The first byte of the digest picks the shard (see shardFor).
	sh := &s.shards[prefix[0]&(numShards-1)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	for id, e := range sh.m {
		if e.live(now) && string(id[:len(prefix)]) == string(prefix) {
			fn(sh, id, e)
		}
	}
}

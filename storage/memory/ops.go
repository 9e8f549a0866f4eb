package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The memory store never blocks outside Wait, so its operations ignore ctx.

// Reserve implements storage.Store. A Replay shares the completed Record
// (see the package documentation); a Conflict's Record carries no Token.
func (s *Store) Reserve(_ context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	if lease <= 0 {
		return storage.Reservation{}, fmt.Errorf("memory: reserve: lease %v is not positive", lease)
	}
	sh, id := s.shardFor(key)
	scope := s.scopeOf(key)
	for {
		now := s.now()
		sh.mu.Lock()
		old := sh.m[id]
		if old != nil && old.live(now) {
			res := s.reservation(old, fp)
			sh.mu.Unlock()
			if res.Outcome == storage.Replay {
				rec, err := s.completed(old, true) // old.resp never changes
				if err != nil {
					return storage.Reservation{}, fmt.Errorf("memory: reserve: %w", err)
				}
				res.Record = rec
			}
			return res, nil
		}
		// Replacing an expired entry keeps the counts (same key, same
		// scope); only a new key needs room.
		if old == nil {
			if !s.admit() {
				sh.mu.Unlock()
				if !s.makeRoom() {
					return storage.Reservation{}, storage.ErrFull
				}
				continue // the key may have appeared meanwhile: look again
			}
			if !s.admitScope(scope) {
				s.count.Add(-1)
				sh.mu.Unlock()
				return storage.Reservation{}, storage.ErrScopeFull
			}
		}
		e := newEntry(fp, storage.NewToken(), now, lease, scope)
		sh.m[id] = e
		if old != nil {
			old.wake() // taken over: its waiters look again
		}
		sh.mu.Unlock()
		return storage.Reservation{Outcome: storage.Acquired, Token: e.token}, nil
	}
}

// Complete implements storage.Store. It encodes resp (into one block the
// garbage collector need not scan); the caller keeps resp.
func (s *Store) Complete(_ context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("memory: complete: ttl %v is not positive", ttl)
	}
	// Refused before the record is touched: the lease stays the caller's.
	if err := storage.CheckResponse(resp); err != nil {
		return fmt.Errorf("memory: complete: %w", err)
	}
	// Encoded outside the lock to keep the critical section short; the
	// detail goes in the same block, after the response.
	enc := storage.AppendResponse(make([]byte, 0, storage.ResponseLen(resp)+len(resp.Detail)), resp)
	var detail []byte
	if len(resp.Detail) > 0 {
		enc = append(enc, resp.Detail...)
		n := len(enc) - len(resp.Detail)
		enc, detail = enc[:n:n], enc[n:]
	}
	sh, id := s.shardFor(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	if e == nil || !e.owns(token) {
		return storage.ErrLeaseLost
	}
	e.expires = after(now, ttl)
	e.resp, e.detail = enc, detail
	e.token = 0
	e.wake()
	return nil
}

// Release implements storage.Store.
func (s *Store) Release(_ context.Context, key storage.Key, token storage.Token) error {
	sh, id := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	if e == nil || !e.owns(token) {
		return storage.ErrLeaseLost
	}
	s.remove(sh, id, e)
	return nil
}

// Renew implements storage.Store.
func (s *Store) Renew(_ context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("memory: renew: lease %v is not positive", lease)
	}
	sh, id := s.shardFor(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	if e == nil || !e.owns(token) {
		return storage.ErrLeaseLost
	}
	e.expires = after(now, lease)
	return nil
}

// Get implements storage.Store. With withBody, a completed record is the
// shared one (see the package documentation); without, it is a copy whose
// Response is a shallow copy without Body.
func (s *Store) Get(_ context.Context, key storage.Key, withBody bool) (*storage.Record, error) {
	sh, id := s.shardFor(key)
	now := s.now()
	sh.mu.Lock()
	e := sh.m[id]
	if e == nil || !e.live(now) {
		sh.mu.Unlock()
		return nil, storage.ErrNotFound
	}
	if e.resp != nil {
		sh.mu.Unlock()
		// e.resp never changes once set, so decoding outside the lock is
		// safe.
		rec, err := s.completed(e, withBody)
		if err != nil {
			return nil, fmt.Errorf("memory: get: %w", err)
		}
		return rec, nil
	}
	rec := &storage.Record{
		Fingerprint: e.fp,
		State:       storage.InFlight,
		Token:       e.token,
		CreatedAt:   s.at(e.created),
		ExpiresAt:   s.at(e.expires),
	}
	sh.mu.Unlock()
	return rec, nil
}

// Delete implements storage.Store.
func (s *Store) Delete(_ context.Context, key storage.Key) error {
	sh, id := s.shardFor(key)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	if e == nil || !e.live(now) {
		return storage.ErrNotFound
	}
	s.remove(sh, id, e)
	return nil
}

// remove deletes e, held under key, from sh, whose lock the caller holds.
func (s *Store) remove(sh *shard, id recordID, e *entry) {
	delete(sh.m, id)
	s.count.Add(-1)
	s.forgetScope(e.scope, 1)
	e.wake()
}

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
		return storage.Reservation{}, fmt.Errorf("memory: reserve: %w: lease %v is not positive", storage.ErrInvalid, lease)
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
		cost := entryCost(len(fp))
		// Replacing an expired entry keeps the record count (same key,
		// same scope) and needs no room: only a new key does.
		if old == nil {
			if !s.admit(cost) {
				sh.mu.Unlock()
				if !s.makeRoom(cost) {
					return storage.Reservation{}, storage.ErrFull
				}
				continue // the key may have appeared meanwhile: look again
			}
			if !s.admitScope(scope, cost) {
				s.count.Add(-1)
				s.bytes.Add(-cost)
				sh.mu.Unlock()
				// The scope's own oldest refusal record gives way, if it
				// has one; the key may have appeared meanwhile.
				if s.evictRefusal(scope, true) {
					continue
				}
				return storage.Reservation{}, storage.ErrScopeFull
			}
		}
		e := newEntry(fp, storage.NewToken(), now, lease, scope)
		sh.m[id] = e
		if old != nil {
			// Taken over: the old record's bytes go, the new entry's
			// come; its waiters look again.
			freed := old.footprint()
			s.bytes.Add(cost - freed)
			s.growScope(scope, cost-freed, false)
			s.forgetRefusal(old)
			old.wake()
		}
		sh.mu.Unlock()
		return storage.Reservation{Outcome: storage.Acquired, Token: e.token}, nil
	}
}

// Complete implements storage.Store. It encodes resp (into one block the
// garbage collector need not scan); the caller keeps resp.
func (s *Store) Complete(_ context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("memory: complete: %w: ttl %v is not positive", storage.ErrInvalid, ttl)
	}
	// Refused before the record is touched: the lease stays the caller's.
	if err := storage.CheckResponse(resp); err != nil {
		return fmt.Errorf("memory: complete: %w", err)
	}
	// Encoded and counted outside the lock to keep the critical section
	// short.
	scope := s.scopeOf(key)
	var extra int64 // a refusal record's place in the refusal lists
	refused := s.tracksRefusals && refusal(resp.Status)
	if refused {
		extra = refusalCost
	}
	enc, detail := encodeRecord(resp)
	cost := int64(cap(enc)+cap(detail)) + extra
	if !s.grow(scope, cost) {
		// No room for the body, in the store or, under pressure, in the
		// scope's share. The request ran, so the record is kept all the
		// same, as a response too large to record is: status and
		// headers, the body omitted.
		enc, detail = encodeRecord(&storage.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true, OutcomeUnknown: resp.OutcomeUnknown, Detail: resp.Detail})
		cost = int64(cap(enc)+cap(detail)) + extra
		s.bytes.Add(cost)
		s.growScope(scope, cost, false)
	}
	now := s.now()
	err := s.fenced(key, token, func(_ *shard, id recordID, e *entry) {
		e.expires = after(now, ttl)
		e.resp, e.detail = enc, detail
		e.token = 0
		if refused {
			e.token = s.refusals.add(id, scope)
		}
		e.wake()
	})
	if err != nil {
		s.bytes.Add(-cost)
		s.forgetScope(scope, 0, cost)
	}
	return err
}

// Release implements storage.Store.
func (s *Store) Release(_ context.Context, key storage.Key, token storage.Token) error {
	return s.fenced(key, token, s.remove)
}

// Renew implements storage.Store.
func (s *Store) Renew(_ context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("memory: renew: %w: lease %v is not positive", storage.ErrInvalid, lease)
	}
	now := s.now()
	return s.fenced(key, token, func(_ *shard, _ recordID, e *entry) {
		e.expires = after(now, lease)
	})
}

var _ storage.BatchRenewer = (*Store)(nil)

// RenewBatch implements storage.BatchRenewer: each lease as Renew, with
// no round trip to save.
func (s *Store) RenewBatch(ctx context.Context, batch []storage.Renewal) error {
	for i := range batch {
		batch[i].Err = s.Renew(ctx, batch[i].Key, batch[i].Token, batch[i].Lease)
	}
	return nil
}

// fenced runs fn on key's entry under its shard's lock if token still
// holds the entry's lease, and returns storage.ErrLeaseLost without
// calling fn otherwise: the fencing of Complete, Release and Renew.
func (s *Store) fenced(key storage.Key, token storage.Token, fn func(sh *shard, id recordID, e *entry)) error {
	sh, id := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	if e == nil || !e.owns(token) {
		return storage.ErrLeaseLost
	}
	fn(sh, id, e)
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
	fp := e.footprint()
	s.count.Add(-1)
	s.bytes.Add(-fp)
	s.forgetScope(e.scope, 1, fp)
	s.forgetRefusal(e)
	e.wake()
}

// encodeRecord encodes resp, and its detail after it in the same block:
// one pointer-free allocation the garbage collector need not scan.
func encodeRecord(resp *storage.Response) (enc, detail []byte) {
	enc = storage.AppendResponse(make([]byte, 0, storage.ResponseLen(resp)+len(resp.Detail)), resp)
	if len(resp.Detail) == 0 {
		return enc, nil
	}
	enc = append(enc, resp.Detail...)
	n := len(enc) - len(resp.Detail)
	return enc[:n:n], enc[n:]
}

// grow counts cost more bytes for a completed record of scope, if they fit
// under MaxBytes and, when the store is under pressure, in the scope's
// share.
func (s *Store) grow(scope scopeID, cost int64) bool {
	if !addWithin(&s.bytes, cost, s.maxBytes) {
		return false
	}
	if !s.growScope(scope, cost, true) {
		s.bytes.Add(-cost)
		return false
	}
	return true
}

package memory

import (
	"context"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Wait implements storage.Waiter. It returns nil at once when key has no
// live in-flight record. Otherwise it returns when the record is completed,
// released, deleted, taken over or swept, when its lease lapses (the
// caller may then take the key over), after maxWait (nil), or when ctx is
// done (ctx.Err()).
func (s *Store) Wait(ctx context.Context, key storage.Key, maxWait time.Duration) error {
	sh, id := s.shardFor(key)
	now := s.now()
	sh.mu.Lock()
	e := sh.m[id]
	if e == nil || e.resp != nil || !e.live(now) {
		sh.mu.Unlock()
		return nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	done := e.done
	// A crashed owner never completes: wake up when its lease lapses rather
	// than sit out maxWait. A renewal meanwhile only costs a spurious wake.
	if lapse := time.Duration(e.expires - now); lapse < maxWait {
		maxWait = lapse
	}
	sh.mu.Unlock()

	t := time.NewTimer(maxWait)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

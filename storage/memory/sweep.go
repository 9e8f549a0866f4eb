package memory

import (
	"sync/atomic"
	"time"
)

// admit counts one more record of cost bytes if the store has room for
// it. It never overshoots, even for a moment, so Len stays within MaxKeys
// and Bytes within MaxBytes.
func (s *Store) admit(cost int64) bool {
	if !addWithin(&s.count, 1, s.max) {
		return false
	}
	if !addWithin(&s.bytes, cost, s.maxBytes) {
		s.count.Add(-1)
		return false
	}
	return true
}

// addWithin adds n to v unless that would take it beyond limit.
func addWithin(v *atomic.Int64, n, limit int64) bool {
	for {
		cur := v.Load()
		if cur+n > limit {
			return false
		}
		if v.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// hasRoom reports whether a record of cost bytes would fit now.
func (s *Store) hasRoom(cost int64) bool {
	return s.count.Load() < s.max && s.bytes.Load()+cost <= s.maxBytes
}

// makeRoom is called by Reserve, holding no lock, when the store has no
// room for a record of cost bytes. It sweeps expired records unless
// another sweep ran within minSweepGap, then evicts the oldest refusal
// records until there is room (refusal.go), and reports whether there may
// be room now. Nothing else is ever evicted.
func (s *Store) makeRoom(cost int64) bool {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	// Whoever held sweepMu before may have made room already.
	if s.hasRoom(cost) {
		return true
	}
	if s.now()-s.lastSweep >= int64(minSweepGap) {
		s.sweepLocked()
	}
	for !s.hasRoom(cost) {
		if !s.evictRefusal(0, false) {
			return false
		}
	}
	return true
}

// sweep deletes every expired record and lapsed lease.
func (s *Store) sweep() {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	s.sweepLocked()
}

// sweepLocked does the work of sweep; the caller holds sweepMu. It takes one
// shard lock at a time so that Reserve on other shards keeps going.
func (s *Store) sweepLocked() {
	var removed int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		var n, bytes int64
		for key, e := range sh.m {
			if !e.live(now) {
				delete(sh.m, key)
				fp := e.footprint()
				s.forgetScope(e.scope, 1, fp)
				s.forgetRefusal(e)
				e.wake()
				n++
				bytes += fp
			}
		}
		sh.mu.Unlock()
		s.count.Add(-n)
		s.bytes.Add(-bytes)
		removed += n
	}
	s.lastSweep = s.now()
	if removed > 0 && s.onRemove != nil {
		s.onRemove(true, removed)
	}
}

// janitor sweeps every interval until Close.
func (s *Store) janitor(interval time.Duration) {
	defer close(s.janitorDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

package memory

import "time"

// admit counts one more record if the store has room for it. It never
// overshoots, even for a moment, so Len stays within MaxKeys.
func (s *Store) admit() bool {
	for {
		n := s.count.Load()
		if n >= s.max {
			return false
		}
		if s.count.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// makeRoom is called by Reserve, holding no lock, when the store is full. It
// sweeps expired records unless another sweep ran within minSweepGap, and
// reports whether there may be room now.
func (s *Store) makeRoom() bool {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	// Whoever held sweepMu before may have made room already.
	if s.count.Load() < s.max {
		return true
	}
	if s.now()-s.lastSweep < int64(minSweepGap) {
		return false
	}
	s.sweepLocked()
	return s.count.Load() < s.max
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
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		var n int64
		for key, e := range sh.m {
			if !e.live(now) {
				delete(sh.m, key)
				s.forgetScope(e.scope, 1)
				e.wake()
				n++
			}
		}
		sh.mu.Unlock()
		s.count.Add(-n)
	}
	s.lastSweep = s.now()
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

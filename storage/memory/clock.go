package memory

import (
	"math"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// now returns the monotonic time in nanoseconds since s.base.
func (s *Store) now() int64 {
	return int64(s.elapsed())
}

// at converts a time from s.now back to a time.Time.
func (s *Store) at(ns int64) time.Time {
	return s.base.Add(time.Duration(ns))
}

// after returns the time d after now: d clamped to storage.MaxDuration,
// and the sum saturating at the int64 maximum, so that no lease or TTL,
// however long, wraps around into the past (a ttl of 106751d added to a
// day of uptime would).
func after(now int64, d time.Duration) int64 {
	d = storage.Clamp(d)
	if now > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return now + int64(d)
}

package memory

import (
	"sync/atomic"
	"time"
)

// Clock is a clock that tests move by hand, so that leases and TTLs
// lapse when a test says and never because the machine was slow.
type Clock struct{ ns atomic.Int64 }

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// NewWithClock is New on the clock c, which starts at zero.
func NewWithClock(opts Options, c *Clock) *Store {
	return newStore(opts, time.Now(), func() time.Duration { return time.Duration(c.ns.Load()) })
}

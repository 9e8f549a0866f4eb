package storage

import "time"

// MaxDuration is the longest lease or TTL a store keeps: about 100 years.
// Stores clamp longer ones to it (see Clamp), so that a lease or TTL up to
// math.MaxInt64 nanoseconds means "for as long as the store may keep
// anything" rather than overflowing into the past when added to the
// current time. It leaves room below the int64 limit for adding it to a
// clock (nanoseconds since a process started, or since 1970) and for
// doubling it (the Redis store keeps an in-flight record for twice its
// lease).
const MaxDuration = 100 * 365 * 24 * time.Hour

// Clamp returns d limited to MaxDuration.
func Clamp(d time.Duration) time.Duration {
	return min(d, MaxDuration)
}

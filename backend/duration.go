package backend

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// CheckDuration reports a duration option outside [lo, hi] as "name must
// be at least lo, got v"; zero is the default, and fine. A bare JSON
// number is nanoseconds, so the floor catches a unit mix-up and the
// ceiling an overflow.
func CheckDuration(name string, v, lo, hi caddy.Duration) error {
	switch {
	case v == 0:
		return nil
	case v < lo:
		return fmt.Errorf("%s must be at least %s, got %s", name, time.Duration(lo), time.Duration(v))
	case v > hi:
		return fmt.Errorf("%s must be at most %s, got %s", name, time.Duration(hi), time.Duration(v))
	}
	return nil
}

// Package knobs holds the few values of the module that its own tests
// turn: production never changes them, and being internal they are no
// option of the module's. Each is atomic, so a test may set it while
// requests run.
package knobs

import (
	"sync/atomic"
	"time"
)

// ClientStallTimeout is how long a client may take no byte of an answer
// before it counts as gone (see the recorder in the root package): 10 s.
// The randomized test scales it down, so that its slow and sleeping
// clients take seconds rather than minutes.
var ClientStallTimeout atomic.Int64

// The bounds of waiting requests, per handler (see wait.go in the root
// package): 1000 requests in all, 250 for one client (scope), 64 for one
// key, 64 MiB of request bodies (a quarter of it for one client, and for
// one key). The handler's tests lower them, so that a few requests meet
// them.
var (
	MaxWaiters         atomic.Int64
	MaxWaitersPerScope atomic.Int64
	MaxWaitersPerKey   atomic.Int64
	MaxWaitingBytes    atomic.Int64
)

func init() {
	ClientStallTimeout.Store(int64(10 * time.Second))
	MaxWaiters.Store(1000)
	MaxWaitersPerScope.Store(250)
	MaxWaitersPerKey.Store(64)
	MaxWaitingBytes.Store(64 << 20)
}

// StallTimeout is ClientStallTimeout as a duration.
func StallTimeout() time.Duration { return time.Duration(ClientStallTimeout.Load()) }

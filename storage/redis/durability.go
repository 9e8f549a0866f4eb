package redis

// Durability: WAIT after the writes a retry's safety depends on.
//
// Redis replicates asynchronously: a reservation the primary took just
// before it died may be missing on the replica promoted in its place, and
// the retry then runs the upstream again. With Durability.Replicas set,
// the Store sends WAIT right behind each reservation and completion, in
// the same pipeline and so on the same connection (WAIT counts the
// replicas that have every write of its own connection): one round trip
// still, and the pipelines that batch concurrent operations share one
// WAIT. On Cluster, each node's share of a batch goes to that node with a
// WAIT of its own.
//
// A reservation that too few replicas acknowledged in time fails (unless
// Proceed): the caller releases it. A completion that falls short fails
// too, with an error wrapping ErrNotReplicated and storage.ErrUnavailable,
// though it is recorded on the primary and its answer given: a replica
// promoted now would hold the record in flight, and a retry would run
// again once its lease lapsed. The caller (the Caddy module's aftercare)
// sends it again, with its WAIT, keeping the lease renewed, until replicas
// acknowledge it: the script finds the record completed by the same
// lease, writes its token field again (a write, so that the WAIT counts
// the replicas that have everything before it) and Complete answers
// storage.ErrLeaseLost (completed already); or, after a failover, the new
// primary holds it in flight, and the completion lands there.
//
// Releases and renewals are not waited for. A release lost in a failover
// leaves the key in flight on the new primary until its lease lapses
// (retries get 409 meanwhile, never a second run); a renewal lost leaves
// the lease lapsing at the previous renewal's time, at least two thirds
// of a lease away, and the next renewal reaches the new primary.
//
// WAIT is not consensus: it says the replicas have the write, not that a
// failover will pick one of them, nor that a primary cut off by a
// partition stops taking writes. WAITAOF (Redis 7.2) would add that the
// write is on the replicas' disks; the Store does not use it (see
// docs/storage-redis.md).

import (
	"fmt"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
)

// DefaultDurabilityTimeout is how long WAIT blocks when
// Durability.Timeout is zero.
const DefaultDurabilityTimeout = time.Second

// ErrNotReplicated is wrapped, with storage.ErrUnavailable, by the error
// of a Reserve whose reservation fewer replicas than Durability.Replicas
// acknowledged within Durability.Timeout, when Durability.Proceed is off,
// and of a Complete that fell short (storage.ErrNotReplicated, under this
// package's name).
var ErrNotReplicated = storage.ErrNotReplicated

// Durability makes reservations and completions wait until replicas
// acknowledged them (WAIT).
type Durability struct {
	// Replicas is how many replicas must acknowledge each reservation and
	// completion; zero sends no WAIT.
	Replicas int

	// Timeout is how long WAIT blocks at most (default
	// DefaultDurabilityTimeout). It must be shorter than Options.Timeout,
	// which bounds the whole operation.
	Timeout time.Duration

	// Proceed lets a reservation that too few replicas acknowledged in
	// time go on: it is on the primary. Off, Reserve fails with an error
	// wrapping ErrNotReplicated and storage.ErrUnavailable, which the
	// caller treats as any store error, and releases. A completion that
	// falls short fails so either way, to be sent again (see above).
	Proceed bool

	// OnShortfall, when set, is called for every reservation or
	// completion (op "reserve", "complete") that fewer than Replicas
	// acknowledged in time, with how many did. It must not block.
	OnShortfall func(op string, acked int)
}

// Check reports what is wrong with d, for a store whose operations
// take at most timeout (zero: unbounded). Errors name the options as the
// Caddy module spells them.
func (d Durability) Check(timeout time.Duration) error {
	switch {
	case d.Replicas < 0:
		return opterr.Errorf("durability", "redis storage: durability replicas must not be negative, got %d", d.Replicas)
	case d.Timeout < 0:
		return opterr.Errorf("durability", "redis storage: durability timeout must be positive, got %v", d.Timeout)
	case d.Replicas > 0 && d.Timeout != 0 && d.Timeout < time.Millisecond:
		// WAIT takes milliseconds, and 0 would block forever.
		return opterr.Errorf("durability", "redis storage: durability timeout must be at least 1ms, got %v", d.Timeout)
	case d.Replicas > 0 && timeout > 0 && d.timeout() >= timeout:
		return opterr.New(fmt.Errorf("redis storage: durability timeout %v must be shorter than timeout %v, which bounds the whole operation", d.timeout(), timeout), "durability", "timeout")
	}
	return nil
}

// timeout is WAIT's timeout, the default filled in.
func (d Durability) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return DefaultDurabilityTimeout
}

// shortfall reports whether a write that acked replicas acknowledged
// falls short (acked < 0: no WAIT was sent), and calls OnShortfall for it.
func (d Durability) shortfall(op string, acked int) bool {
	if d.Replicas <= 0 || acked < 0 || acked >= d.Replicas {
		return false
	}
	if d.OnShortfall != nil {
		d.OnShortfall(op, acked)
	}
	return true
}

// notReplicated is Reserve's error for a reservation that fell short.
func (d Durability) notReplicated(acked int) error {
	return fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, acked, d.Replicas, d.timeout())
}

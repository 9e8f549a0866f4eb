package memory_test

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// TestTTLNearTheInt64LimitKeepsReplayingAfterUptime is the report: ttl
// 106751d (a little under math.MaxInt64 nanoseconds) stopped replays once
// the store had run for about a day, because the record's expiry, uptime
// plus ttl, overflowed into the past.
func TestTTLNearTheInt64LimitKeepsReplayingAfterUptime(t *testing.T) {
	ctx := t.Context()
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{}, &clock)
	defer s.Close()
	const ttl = 106751 * 24 * time.Hour
	clock.Advance(2 * 24 * time.Hour)
	res, err := s.Reserve(ctx, key(1), fp, time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve: %v, %v", res.Outcome, err)
	}
	if err := s.Complete(ctx, key(1), res.Token, &storage.Response{Status: 201}, ttl); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, 365 * 24 * time.Hour, 50 * 365 * 24 * time.Hour} {
		clock.Advance(d)
		if res, err := s.Reserve(ctx, key(1), fp, time.Minute); err != nil || res.Outcome != storage.Replay {
			t.Fatalf("Reserve after %v more: %v, %v; want replay", d, res.Outcome, err)
		}
	}
}

// TestLeaseNearTheInt64LimitIsHeld: a lease of math.MaxInt64 (a JSON
// lock_timeout near the limit) lapsed at once, letting a second request
// run the same key.
func TestLeaseNearTheInt64LimitIsHeld(t *testing.T) {
	ctx := t.Context()
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{}, &clock)
	defer s.Close()
	clock.Advance(time.Hour)
	if res, err := s.Reserve(ctx, key(1), fp, 1<<63-1); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve: %v, %v", res.Outcome, err)
	}
	clock.Advance(50 * 365 * 24 * time.Hour)
	if res, err := s.Reserve(ctx, key(1), fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
		t.Fatalf("second Reserve: %v, %v; want conflict", res.Outcome, err)
	}
}

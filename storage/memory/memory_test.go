package memory_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

func TestConformance(t *testing.T) {
	s := memory.New(memory.Options{})
	defer s.Close()
	storagetest.Run(t, s)
}

func BenchmarkMemory(b *testing.B) {
	s := memory.New(memory.Options{})
	defer s.Close()
	storagetest.Bench(b, s)
}

var fp = []byte("fingerprint")

func key(i int) storage.Key {
	return storage.Key{Scope: "scope", ID: strconv.Itoa(i)}
}

// fill reserves keys 0..n-1 and returns their tokens.
func fill(t *testing.T, s *memory.Store, n int, lease time.Duration) []storage.Token {
	t.Helper()
	toks := make([]storage.Token, n)
	for i := range n {
		res, err := s.Reserve(t.Context(), key(i), fp, lease)
		if err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("Reserve(%d) = %v, %v", i, res.Outcome, err)
		}
		toks[i] = res.Token
	}
	return toks
}

func TestMaxKeysRefusesNewKeysWhenAllLive(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Options{MaxKeys: 10, MaxKeysPerScope: -1})
	defer s.Close()
	toks := fill(t, s, 10, time.Minute)

	for range 3 { // the later ones come within the sweep throttle
		if _, err := s.Reserve(ctx, key(10), fp, time.Minute); !errors.Is(err, storage.ErrFull) {
			t.Fatalf("Reserve beyond MaxKeys: %v, want ErrFull", err)
		}
	}
	if n := s.Len(); n != 10 {
		t.Fatalf("Len = %d, want 10", n)
	}
	// Keys already held still answer.
	if res, err := s.Reserve(ctx, key(3), fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
		t.Fatalf("Reserve of a held key when full = %v, %v, want conflict", res.Outcome, err)
	}
	if err := s.Release(ctx, key(3), toks[3]); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, key(10), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve after a Release = %v, %v, want acquired", res.Outcome, err)
	}
}

func TestExpiredRecordsAreSweptToMakeRoom(t *testing.T) {
	ctx := t.Context()
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{MaxKeys: 10, MaxKeysPerScope: -1}, &clock)
	defer s.Close()
	for i, tok := range fill(t, s, 10, time.Minute) {
		if err := s.Complete(ctx, key(i), tok, &storage.Response{Status: 200}, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(50 * time.Millisecond)

	// Taking over an expired key replaces it without needing room.
	if res, err := s.Reserve(ctx, key(0), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve of an expired key = %v, %v", res.Outcome, err)
	}
	if n := s.Len(); n != 10 {
		t.Fatalf("Len after replacing an expired record = %d, want 10", n)
	}
	for i := 10; i < 19; i++ {
		if res, err := s.Reserve(ctx, key(i), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("Reserve(%d) after expiry = %v, %v", i, res.Outcome, err)
		}
	}
	if n := s.Len(); n != 10 {
		t.Fatalf("Len = %d, want 10", n)
	}
}

// TestJanitorRemovesExpiredRecords runs the janitor goroutine on a clock
// the test moves: the leases lapse only when the test says so (a busy
// machine once let 30 ms leases lapse before the Complete below, and the
// janitor swept the record it was meant to keep).
func TestJanitorRemovesExpiredRecords(t *testing.T) {
	ctx := t.Context()
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{JanitorInterval: 10 * time.Millisecond}, &clock)
	defer s.Close()
	toks := fill(t, s, 100, 30*time.Millisecond) // 100 leases that will lapse
	// One completed record that must stay.
	if err := s.Complete(ctx, key(0), toks[0], &storage.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != 100 {
		t.Fatalf("Len before the leases lapse = %d, want 100", n)
	}
	clock.Advance(30 * time.Millisecond)
	testutil.Eventually(t, 30*time.Second, "the janitor to leave only the live record", func() bool { return s.Len() == 1 })
	if _, err := s.Get(ctx, key(0), false); err != nil {
		t.Fatalf("Get of the live record: %v", err)
	}
}

func TestCloseIsIdempotentAndStoreStillAnswers(t *testing.T) {
	s := memory.New(memory.Options{JanitorInterval: time.Millisecond})
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.Reserve(t.Context(), key(1), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve after Close = %v, %v", res.Outcome, err)
	}
}

package memory_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

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
	s := memory.New(memory.Options{MaxKeys: 10})
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
	s := memory.New(memory.Options{MaxKeys: 10})
	defer s.Close()
	for i, tok := range fill(t, s, 10, time.Minute) {
		if err := s.Complete(ctx, key(i), tok, &storage.Response{Status: 200}, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(150 * time.Millisecond)

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

func TestJanitorRemovesExpiredRecords(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Options{JanitorInterval: 10 * time.Millisecond})
	defer s.Close()
	toks := fill(t, s, 100, 30*time.Millisecond) // 100 leases that will lapse
	// One completed record that must stay.
	if err := s.Complete(ctx, key(0), toks[0], &storage.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return s.Len() == 1 })
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

func TestWaiterWakesOnDelete(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Options{})
	defer s.Close()
	fill(t, s, 1, time.Minute)
	time.AfterFunc(50*time.Millisecond, func() { s.Delete(ctx, key(0)) })
	if took := timeWait(t, s, key(0)); took > 3*time.Second {
		t.Fatalf("Wait returned %v after Delete", took)
	}
}

func TestWaiterWakesWhenLeaseLapses(t *testing.T) {
	s := memory.New(memory.Options{})
	defer s.Close()
	fill(t, s, 1, 100*time.Millisecond)
	// Nobody completes: the waiter must not sit out maxWait, it may take
	// the key over now.
	if took := timeWait(t, s, key(0)); took < 90*time.Millisecond || took > 3*time.Second {
		t.Fatalf("Wait returned after %v, want about the 100ms lease", took)
	}
	if res, err := s.Reserve(t.Context(), key(0), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("Reserve after lapse = %v, %v", res.Outcome, err)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	s := memory.New(memory.Options{})
	defer s.Close()
	fill(t, s, 1, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.Wait(ctx, key(0), 5*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the context's error", err)
	}
}

// timeWait waits on key with a 5s maxWait and returns how long it took.
func timeWait(t *testing.T, s *memory.Store, key storage.Key) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.Wait(t.Context(), key, 5*time.Second); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return time.Since(start)
}

// eventually fails unless cond holds within 2 seconds.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 2s")
		}
	}
}

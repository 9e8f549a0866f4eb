package memory_test

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func TestMaxKeysPerScopeRefusesOnlyTheFullScope(t *testing.T) {
	ctx := t.Context()
	// Three records are half the store: the share binds from the fourth.
	s := memory.New(memory.Options{MaxKeys: 6, MaxKeysPerScope: 3})
	defer s.Close()
	toks := fill(t, s, 3, time.Minute) // scope "scope"

	if _, err := s.Reserve(ctx, key(3), fp, time.Minute); !errors.Is(err, storage.ErrScopeFull) {
		t.Fatalf("fourth key of one scope: %v, want ErrScopeFull", err)
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("Len = %d after a refused key, want 3", n)
	}
	other := storage.Key{Scope: "other", ID: "0"}
	if res, err := s.Reserve(ctx, other, fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("another scope: %v, %v; want Acquired", res.Outcome, err)
	}
	// Known keys of the full scope still answer: only new keys need room.
	if res, err := s.Reserve(ctx, key(0), fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
		t.Fatalf("known key of the full scope: %v, %v; want Conflict", res.Outcome, err)
	}

	// Releasing one record makes room for one key.
	if err := s.Release(ctx, key(0), toks[0]); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, key(3), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("after a release: %v, %v; want Acquired", res.Outcome, err)
	}
	if _, err := s.Reserve(ctx, key(4), fp, time.Minute); !errors.Is(err, storage.ErrScopeFull) {
		t.Fatalf("full again: %v, want ErrScopeFull", err)
	}
	// Completing keeps the record, and its count.
	if err := s.Complete(ctx, key(1), toks[1], &storage.Response{Status: 201}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, key(4), fp, time.Minute); !errors.Is(err, storage.ErrScopeFull) {
		t.Fatalf("after a completion: %v, want ErrScopeFull", err)
	}
	if err := s.Delete(ctx, key(1)); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, key(4), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("after a delete: %v, %v; want Acquired", res.Outcome, err)
	}
}

func TestExpiredRecordsStopCountingForTheirScopeOnceSwept(t *testing.T) {
	ctx := t.Context()
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{MaxKeys: 4, MaxKeysPerScope: 2, JanitorInterval: 20 * time.Millisecond}, &clock)
	defer s.Close()
	fill(t, s, 2, 30*time.Millisecond)
	// Taking over an expired key of a full scope needs no room.
	clock.Advance(30 * time.Millisecond)
	if res, err := s.Reserve(ctx, key(0), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("takeover of an expired key: %v, %v; want Acquired", res.Outcome, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := s.Reserve(ctx, key(2), fp, time.Minute)
		if err == nil && res.Outcome == storage.Acquired {
			break
		}
		if !errors.Is(err, storage.ErrScopeFull) || time.Now().After(deadline) {
			t.Fatalf("new key once the janitor ran: %v, %v; want Acquired", res.Outcome, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNegativeMaxKeysPerScopeIsUnbounded(t *testing.T) {
	s := memory.New(memory.Options{MaxKeys: 100, MaxKeysPerScope: -1})
	defer s.Close()
	fill(t, s, 100, time.Minute) // the whole store, one scope
}

package cache_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
	"github.com/caddy-idempotency/caddy-idempotency/storage/storagetest"
)

func TestConformance(t *testing.T) {
	inner := memory.New(memory.Options{})
	defer inner.Close()
	storagetest.Run(t, cache.New(inner, cache.Options{MaxEntries: 1000, TTL: time.Minute}))
}

// counting counts the Reserve calls that reach the store.
type counting struct {
	storage.Store
	reserves atomic.Int64
}

func (c *counting) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	c.reserves.Add(1)
	return c.Store.Reserve(ctx, key, fp, lease)
}

func complete(t *testing.T, s storage.Store, key storage.Key, fp string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Reserve(ctx, key, []byte(fp), time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve: %v %v", res.Outcome, err)
	}
	resp := &storage.Response{Status: 201, Header: http.Header{"X": {"1"}}, Body: []byte("done")}
	if err := s.Complete(ctx, key, res.Token, resp, ttl); err != nil {
		t.Fatal(err)
	}
}

func TestReplaysAfterTheFirstCostNoStoreCall(t *testing.T) {
	inner := &counting{Store: memory.New(memory.Options{})}
	s := cache.New(inner, cache.Options{MaxEntries: 100, TTL: time.Minute})
	key := storage.Key{Scope: "s", ID: "k"}
	complete(t, s, key, "fp", time.Hour)
	before := inner.reserves.Load()
	for range 10 {
		res, err := s.Reserve(context.Background(), key, []byte("fp"), time.Minute)
		if err != nil || res.Outcome != storage.Replay || string(res.Record.Response.Body) != "done" {
			t.Fatalf("replay: %v %v", res.Outcome, err)
		}
	}
	if n := inner.reserves.Load() - before; n != 1 {
		t.Fatalf("10 replays reached the store %d times, want 1 (the first)", n)
	}
	res, _ := s.Reserve(context.Background(), key, []byte("other"), time.Minute)
	if res.Outcome != storage.Mismatch {
		t.Fatalf("other fingerprint from the cache: %v, want Mismatch", res.Outcome)
	}
}

func TestEntriesNeverOutliveTheRecordOrTheTTL(t *testing.T) {
	inner := &counting{Store: memory.New(memory.Options{})}
	s := cache.New(inner, cache.Options{MaxEntries: 100, TTL: time.Hour})
	short := storage.Key{Scope: "s", ID: "short"}
	// The record lives long enough that no stall of a busy machine comes
	// between its completion and the replay that caches it.
	const ttl = 2 * time.Second
	start := time.Now()
	complete(t, s, short, "fp", ttl)
	if res, err := s.Reserve(context.Background(), short, []byte("fp"), time.Minute); err != nil || res.Outcome != storage.Replay {
		t.Fatalf("replay %v after completing for %v: %v %v", time.Since(start), ttl, res.Outcome, err)
	} // cached now
	time.Sleep(time.Until(start.Add(ttl + 200*time.Millisecond)))
	res, err := s.Reserve(context.Background(), short, []byte("fp"), time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("after the record expired: %v %v, want Acquired", res.Outcome, err)
	}

	briefly := cache.New(inner, cache.Options{MaxEntries: 100, TTL: 100 * time.Millisecond})
	key := storage.Key{Scope: "s", ID: "ttl"}
	complete(t, briefly, key, "fp", time.Hour)
	briefly.Reserve(context.Background(), key, []byte("fp"), time.Minute)
	time.Sleep(250 * time.Millisecond)
	before := inner.reserves.Load()
	briefly.Reserve(context.Background(), key, []byte("fp"), time.Minute)
	if inner.reserves.Load() == before {
		t.Fatal("an entry was served past the cache TTL")
	}
}

func TestDeleteDropsTheEntry(t *testing.T) {
	inner := memory.New(memory.Options{})
	s := cache.New(inner, cache.Options{MaxEntries: 100, TTL: time.Hour})
	key := storage.Key{Scope: "s", ID: "k"}
	complete(t, s, key, "fp", time.Hour)
	s.Reserve(context.Background(), key, []byte("fp"), time.Minute)
	if err := s.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(context.Background(), key, []byte("fp"), time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("after Delete: %v %v, want Acquired", res.Outcome, err)
	}
}

func TestMaxEntriesBoundsTheCache(t *testing.T) {
	inner := &counting{Store: memory.New(memory.Options{})}
	s := cache.New(inner, cache.Options{MaxEntries: 16, TTL: time.Hour}) // one per shard
	var keys []storage.Key
	for i := range 200 {
		k := storage.Key{Scope: "s", ID: fmt.Sprint(i)}
		keys = append(keys, k)
		complete(t, s, k, "fp", time.Hour)
		s.Reserve(context.Background(), k, []byte("fp"), time.Minute)
	}
	before := inner.reserves.Load()
	for _, k := range keys {
		s.Reserve(context.Background(), k, []byte("fp"), time.Minute)
	}
	if hits := 200 - (inner.reserves.Load() - before); hits > 16 {
		t.Fatalf("%d replays served from a cache bounded to 16 entries", hits)
	}
}

func TestWaiterIsKept(t *testing.T) {
	if _, ok := cache.New(memory.New(memory.Options{}), cache.Options{MaxEntries: 1, TTL: time.Second}).(storage.Waiter); !ok {
		t.Fatal("the cache hides the store's Waiter")
	}
	if _, ok := cache.New(struct{ storage.Store }{memory.New(memory.Options{})}, cache.Options{MaxEntries: 1, TTL: time.Second}).(storage.Waiter); ok {
		t.Fatal("the cache claims a Waiter the store does not have")
	}
}

// TestBatchRenewerIsKept: with a replay cache in front of it, a store
// still renews its leases in batches (the memory store does, a store
// hidden behind a bare struct does not).
func TestBatchRenewerIsKept(t *testing.T) {
	opts := cache.Options{MaxEntries: 1, TTL: time.Second}
	mem := memory.New(memory.Options{})
	defer mem.Close()
	s := cache.New(mem, opts)
	b, ok := s.(storage.BatchRenewer)
	if !ok {
		t.Fatal("the cache hides the store's BatchRenewer")
	}
	if _, ok := s.(storage.Waiter); !ok {
		t.Fatal("the cache hides the store's Waiter beside its BatchRenewer")
	}
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := s.Reserve(t.Context(), key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	batch := []storage.Renewal{{Key: key, Token: res.Token, Lease: time.Hour}, {Key: key, Token: res.Token + 1, Lease: time.Hour}}
	if err := b.RenewBatch(t.Context(), batch); err != nil || batch[0].Err != nil || batch[1].Err != storage.ErrLeaseLost {
		t.Fatalf("RenewBatch through the cache: %v; %v, %v", err, batch[0].Err, batch[1].Err)
	}
	if _, ok := cache.New(struct{ storage.Store }{mem}, opts).(storage.BatchRenewer); ok {
		t.Fatal("the cache claims a BatchRenewer the store does not have")
	}
	renewing := struct {
		storage.Store
		storage.BatchRenewer
	}{mem, mem}
	s = cache.New(renewing, opts)
	if _, ok := s.(storage.BatchRenewer); !ok {
		t.Fatal("the cache hides the BatchRenewer of a store that does not wait")
	}
	if _, ok := s.(storage.Waiter); ok {
		t.Fatal("the cache claims a Waiter the store does not have")
	}
}

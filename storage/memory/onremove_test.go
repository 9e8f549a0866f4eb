package memory_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// removals counts what Options.OnRemove is told.
type removals struct {
	mu               sync.Mutex
	expired, evicted int64
}

func (r *removals) onRemove(expired bool, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if expired {
		r.expired += n
	} else {
		r.evicted += n
	}
}

func (r *removals) get() (expired, evicted int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expired, r.evicted
}

// TestOnRemoveCountsWhatTheJanitorAndEvictionsRemove: the janitor's
// sweep reports the expired records and lapsed leases it deleted, and a
// full store each refusal record it evicts; what expires without being
// deleted yet, and a record deleted by a caller, are not reported.
func TestOnRemoveCountsWhatTheJanitorAndEvictionsRemove(t *testing.T) {
	var got removals
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{MaxKeys: 10, MaxKeysPerScope: -1, JanitorInterval: 10 * time.Millisecond, OnRemove: got.onRemove}, &clock)
	defer s.Close()
	for i := range 3 { // completed, expire after an hour
		if err := reserveComplete(t, s, storage.Key{Scope: "s", ID: fmt.Sprint("done-", i)}, &storage.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}
	}
	// A lease that lapses after a minute.
	if _, err := s.Reserve(t.Context(), storage.Key{Scope: "s", ID: "lapsing"}, fp, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Deleted by a caller (the admin API): not the store's own removal.
	deleted := storage.Key{Scope: "s", ID: "deleted"}
	if err := reserveComplete(t, s, deleted, &storage.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), deleted); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // sweeps that find nothing say nothing
	if exp, ev := got.get(); exp != 0 || ev != 0 {
		t.Fatalf("before anything expired: expired %d, evicted %d; want 0 and 0", exp, ev)
	}
	clock.Advance(2 * time.Hour)
	testutil.Eventually(t, 5*time.Second, "the janitor to report 4 expired records", func() bool {
		exp, _ := got.get()
		return exp == 4
	})

	// A full store of refusal records: each new key evicts one.
	for i := range 10 {
		if err := reserveComplete(t, s, storage.Key{Scope: "s", ID: fmt.Sprint("refused-", i)}, statusResponse(http.StatusNotFound)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := reserveComplete(t, s, storage.Key{Scope: "s", ID: fmt.Sprint("new-", i)}, &storage.Response{Status: 201}); err != nil {
			t.Fatal(err)
		}
	}
	if exp, ev := got.get(); exp != 4 || ev != 3 || s.EvictedRefusals() != 3 {
		t.Fatalf("after 3 new keys in a store full of refusals: expired %d, evicted %d (EvictedRefusals %d); want 4 and 3", exp, ev, s.EvictedRefusals())
	}
}

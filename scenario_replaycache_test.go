package idempotency

import (
	"net/http"
	"testing"
	"time"
)

// TestReplayCacheServesReplaysWithoutTheStore checks that a cached replay
// needs no store: it survives the record vanishing from the store (a
// FLUSH or a DELETE by someone else) until the cache entry's ttl ends,
// and still tells another request with the key apart.
func TestReplayCacheServesReplaysWithoutTheStore(t *testing.T) {
	sharedBackends(t).run(func(t *testing.T, b *testStore) {
		// The cache's ttl is long next to any stall of a busy machine
		// between caching the record and the checks that it is served.
		const ttl = 2 * time.Second
		h := b.handlerWith(t, &Handler{}, `"replay_cache":{"max_entries":100,"ttl":"2s"}`)
		up := &upstream{}
		serve(h, up, request("cached", "{}"))
		if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatal("no replay")
		}
		cached := time.Now() // the entry was made before: it ends before cached+ttl
		b.forget(t)          // the record is gone from the store
		if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != `{"order":42}` {
			t.Fatalf("cached replay after the record left the store: %d %q", w.Code, w.Body.String())
		}
		if up.calls.Load() != 1 {
			t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
		}
		if w := serve(h, up, request("cached", `{"other":1}`)); w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("other request against the cached record: %d, want 422", w.Code)
		}
		time.Sleep(time.Until(cached.Add(ttl + 200*time.Millisecond))) // past the cache ttl
		if w := serve(h, up, request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatal("replayed from the cache after its ttl")
		}
		if up.calls.Load() != 2 {
			t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
		}
	})
}

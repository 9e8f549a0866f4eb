package storagetest

import (
	"maps"
	"slices"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// testListInFlight: a store that implements storage.InFlightLister lists
// its records in flight, page by page in the order of their key's Hash,
// and never a completed one.
func testListInFlight(f *fixture) {
	lister, ok := f.store.(storage.InFlightLister)
	if !ok {
		f.t.Skip("store does not implement storage.InFlightLister")
	}
	done := f.key()
	f.complete(done, f.acquire(done, fpA, longLease), textResponse("x"), longTTL)
	running := map[string]storage.Token{}
	for range 5 {
		key := f.key()
		running[key.Hash()] = f.acquire(key, fpA, longLease)
	}

	// Pages of two, until the last; other cases' records may be there too.
	seen := map[string]bool{}
	after, last := "", ""
	for page := 0; ; page++ {
		recs, err := lister.ListInFlight(f.ctx, after, 2)
		if err != nil {
			f.t.Fatalf("ListInFlight(%q, 2): %v", after, err)
		}
		if len(recs) > 2 {
			f.t.Fatalf("ListInFlight(%q, 2) returned %d records", after, len(recs))
		}
		if len(recs) == 0 {
			break
		}
		if page > 100_000 {
			f.t.Fatal("ListInFlight never ends")
		}
		for _, r := range recs {
			if r.KeyHash <= last {
				f.t.Fatalf("ListInFlight: %s after %s, want the order of key hashes, each once", r.KeyHash, last)
			}
			last = r.KeyHash
			if r.Record == nil || r.Record.State != storage.InFlight {
				f.t.Fatalf("ListInFlight: %s is %+v, want a record in flight", r.KeyHash, r.Record)
			}
			if tok, ours := running[r.KeyHash]; ours && r.Record.Token != tok {
				f.t.Fatalf("ListInFlight: %s has token %d, want %d", r.KeyHash, r.Record.Token, tok)
			}
			seen[r.KeyHash] = true
		}
		after = last
	}
	if seen[done.Hash()] {
		f.t.Fatal("ListInFlight listed a completed record")
	}
	for kh := range running {
		if !seen[kh] {
			f.t.Fatalf("ListInFlight never listed %s, in flight (listed %v)", kh, slices.Sorted(maps.Keys(seen)))
		}
	}
}

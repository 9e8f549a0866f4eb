package storagetest

import (
	"maps"
	"net/http"
	"slices"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// unknownResponse is the record of a request whose outcome is unknown,
// as the Caddy module writes it: the status its client got, the mark,
// and the request's detail (for a 422 that names what differs).
func unknownResponse() *storage.Response {
	return &storage.Response{Status: http.StatusGatewayTimeout, OutcomeUnknown: true, Detail: []byte("detail of request A")}
}

// testOutcomeUnknownIsKept: a record completed with the outcome-unknown
// mark keeps its key as any completed record does, and says so wherever
// it is read: Reserve (Replay, or Mismatch with the detail), Get and, for
// a storage.HashFinder, GetByHash. Only the lease's owner writes it.
func testOutcomeUnknownIsKept(f *fixture) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	f.wantErr("Complete with a stale token", f.store.Complete(f.ctx, key, tok+1, unknownResponse(), longTTL), storage.ErrLeaseLost)
	f.complete(key, tok, unknownResponse(), longTTL)
	for range 2 { // every retry, not only the first
		rec := f.replays(key, fpA, unknownResponse())
		if string(rec.Detail) != "detail of request A" {
			f.t.Fatalf("replay Detail %q, want the record's", rec.Detail)
		}
	}
	res := f.want(key, fpB, longLease, storage.Mismatch)
	if res.Record == nil || string(res.Record.Detail) != "detail of request A" {
		f.t.Fatalf("mismatch record %+v, want the detail of the outcome-unknown record", res.Record)
	}
	rec, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get", err, nil)
	if rec.State != storage.Completed {
		f.t.Fatalf("Get: state %v, want completed", rec.State)
	}
	if msg := diffResponse(rec.Response, unknownResponse(), true); msg != "" {
		f.t.Fatalf("Get: %s", msg)
	}
	// Nothing else changes it: no release, no second completion.
	f.wantErr("Release", f.store.Release(f.ctx, key, tok), storage.ErrLeaseLost)
	f.wantErr("Complete again", f.store.Complete(f.ctx, key, tok, textResponse("late"), longTTL), storage.ErrLeaseLost)
	f.replays(key, fpA, unknownResponse())
	if finder, ok := f.store.(storage.HashFinder); ok {
		recs, err := finder.GetByHash(f.ctx, key.Hash(), false)
		if err != nil || len(recs) != 1 || recs[0].Response == nil || !recs[0].Response.OutcomeUnknown {
			f.t.Fatalf("GetByHash = %+v, %v; want the outcome-unknown record", recs, err)
		}
	}
}

// testOutcomeUnknownIsListedAndReleased: a store that implements
// storage.OutcomeUnknownKeeper lists its outcome-unknown records page by
// page in the order of their key's Hash (and nothing else), and releases
// one by its key's Hash, which frees the key; a release never deletes a
// record in flight or one that holds a response.
func testOutcomeUnknownIsListedAndReleased(f *fixture) {
	keeper, ok := f.store.(storage.OutcomeUnknownKeeper)
	if !ok {
		f.t.Skip("store does not implement storage.OutcomeUnknownKeeper")
	}
	done, running := f.key(), f.key()
	f.complete(done, f.acquire(done, fpA, longLease), textResponse("x"), longTTL)
	f.acquire(running, fpA, longLease)
	unknown := map[string]storage.Key{}
	for range 5 {
		key := f.key()
		f.complete(key, f.acquire(key, fpA, longLease), unknownResponse(), longTTL)
		unknown[key.Hash()] = key
	}

	// Pages of two, until the last; other cases' records may be there too.
	seen := map[string]bool{}
	after, last := "", ""
	for page := 0; ; page++ {
		recs, err := keeper.ListOutcomeUnknown(f.ctx, after, 2)
		if err != nil {
			f.t.Fatalf("ListOutcomeUnknown(%q, 2): %v", after, err)
		}
		if len(recs) > 2 {
			f.t.Fatalf("ListOutcomeUnknown(%q, 2) returned %d records", after, len(recs))
		}
		if len(recs) == 0 {
			break
		}
		if page > 100_000 {
			f.t.Fatal("ListOutcomeUnknown never ends")
		}
		for _, r := range recs {
			if r.KeyHash <= last {
				f.t.Fatalf("ListOutcomeUnknown: %s after %s, want the order of key hashes, each once", r.KeyHash, last)
			}
			last = r.KeyHash
			if r.Record == nil || r.Record.State != storage.Completed || r.Record.Response == nil || !r.Record.Response.OutcomeUnknown {
				f.t.Fatalf("ListOutcomeUnknown: %s is %+v, want an outcome-unknown record", r.KeyHash, r.Record)
			}
			if _, ours := unknown[r.KeyHash]; ours {
				if msg := diffResponse(r.Record.Response, unknownResponse(), false); msg != "" {
					f.t.Fatalf("ListOutcomeUnknown: %s: %s", r.KeyHash, msg)
				}
			}
			seen[r.KeyHash] = true
		}
		after = last
	}
	if seen[done.Hash()] || seen[running.Hash()] {
		f.t.Fatal("ListOutcomeUnknown listed a record that is not outcome-unknown")
	}
	for kh := range unknown {
		if !seen[kh] {
			f.t.Fatalf("ListOutcomeUnknown never listed %s (listed %v)", kh, slices.Sorted(maps.Keys(seen)))
		}
	}

	// A release deletes only what is outcome-unknown.
	for _, other := range []storage.Key{done, running} {
		if n, err := keeper.ReleaseOutcomeUnknown(f.ctx, other.Hash()); err != nil || n != 0 {
			f.t.Fatalf("ReleaseOutcomeUnknown of a record that is not outcome-unknown = %d, %v; want 0", n, err)
		}
	}
	f.replays(done, fpA, textResponse("x"))
	f.want(running, fpA, longLease, storage.Conflict)
	for _, bad := range []string{"", "xyz", done.Hash() + "0"} {
		if n, err := keeper.ReleaseOutcomeUnknown(f.ctx, bad); err != nil || n != 0 {
			f.t.Fatalf("ReleaseOutcomeUnknown(%q) = %d, %v; want 0", bad, n, err)
		}
	}
	for kh, key := range unknown {
		if n, err := keeper.ReleaseOutcomeUnknown(f.ctx, kh); err != nil || n != 1 {
			f.t.Fatalf("ReleaseOutcomeUnknown(%s) = %d, %v; want 1", kh, n, err)
		}
		if n, err := keeper.ReleaseOutcomeUnknown(f.ctx, kh); err != nil || n != 0 {
			f.t.Fatalf("ReleaseOutcomeUnknown(%s) again = %d, %v; want 0", kh, n, err)
		}
		f.acquire(key, fpA, longLease) // the key is free: the next request runs
		break
	}
}

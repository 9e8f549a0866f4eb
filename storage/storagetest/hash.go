package storagetest

import (
	"strings"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// testFindByHash: a store that implements storage.HashFinder finds and
// deletes a record from its key's Hash alone, in flight or completed.
func testFindByHash(f *fixture) {
	finder, ok := f.store.(storage.HashFinder)
	if !ok {
		f.t.Skip("store does not implement storage.HashFinder")
	}
	done, running, other := f.key(), f.key(), f.key()
	tok := f.acquire(done, fpA, longLease)
	f.complete(done, tok, &storage.Response{Status: 201, Body: []byte("body")}, longTTL)
	f.acquire(running, fpA, longLease)
	f.acquire(other, fpA, longLease)

	recs, err := finder.GetByHash(f.ctx, done.Hash(), true)
	if err != nil || len(recs) != 1 || recs[0].State != storage.Completed || string(recs[0].Response.Body) != "body" {
		f.t.Fatalf("GetByHash(completed) = %+v, %v; want its record with the body", recs, err)
	}
	if recs, err = finder.GetByHash(f.ctx, done.Hash(), false); err != nil || len(recs) != 1 || len(recs[0].Response.Body) != 0 {
		f.t.Fatalf("GetByHash(completed, no body) = %+v, %v", recs, err)
	}
	if recs, err = finder.GetByHash(f.ctx, running.Hash(), false); err != nil || len(recs) != 1 || recs[0].State != storage.InFlight {
		f.t.Fatalf("GetByHash(in flight) = %+v, %v", recs, err)
	}
	for _, bad := range []string{"", "zz", strings.Repeat("0", storage.HashLen), "*", strings.ToUpper(done.Hash())} {
		if recs, err := finder.GetByHash(f.ctx, bad, false); err != nil || len(recs) != 0 {
			f.t.Fatalf("GetByHash(%q) = %+v, %v; want nothing", bad, recs, err)
		}
	}

	if n, err := finder.DeleteByHash(f.ctx, done.Hash()); err != nil || n != 1 {
		f.t.Fatalf("DeleteByHash = %d, %v; want 1", n, err)
	}
	f.want(done, fpB, longLease, storage.Acquired) // gone: a new request takes the key
	if n, err := finder.DeleteByHash(f.ctx, done.Hash()+"x"); err != nil || n != 0 {
		f.t.Fatalf("DeleteByHash(malformed) = %d, %v; want 0", n, err)
	}
	f.want(other, fpA, longLease, storage.Conflict) // untouched
}

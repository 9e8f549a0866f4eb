package storagetest

import (
	"bytes"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func testCompletedRecordIsImmutable(f *fixture) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	f.complete(key, tok, textResponse("first"), longTTL)
	f.wantErr("second Complete", f.store.Complete(f.ctx, key, tok, textResponse("second"), longTTL), storage.ErrLeaseLost)
	f.wantErr("Release after Complete", f.store.Release(f.ctx, key, tok), storage.ErrLeaseLost)
	f.wantErr("Renew after Complete", f.store.Renew(f.ctx, key, tok, longLease), storage.ErrLeaseLost)
	f.replays(key, fpA, textResponse("first"))
}

func testReleaseFreesKey(f *fixture) {
	key := f.key()
	old := f.acquire(key, fpA, longLease)
	f.wantErr("Release", f.store.Release(f.ctx, key, old), nil)
	_, err := f.store.Get(f.ctx, key, false)
	f.wantErr("Get after Release", err, storage.ErrNotFound)

	tok := f.acquire(key, fpB, longLease) // a freed key takes any request
	if tok == old {
		f.t.Fatalf("new lease has the released token %d", tok)
	}
	f.wantErr("Complete with released token", f.store.Complete(f.ctx, key, old, textResponse("old"), longTTL), storage.ErrLeaseLost)
	f.wantErr("Renew with released token", f.store.Renew(f.ctx, key, old, longLease), storage.ErrLeaseLost)
	f.wantErr("Release with released token", f.store.Release(f.ctx, key, old), storage.ErrLeaseLost)
	// None of that touched the new lease.
	f.want(key, fpB, longLease, storage.Conflict)
	f.complete(key, tok, textResponse("new"), longTTL)
	f.replays(key, fpB, textResponse("new"))
}

func testCompletedRecordExpires(f *fixture) {
	// Long enough that no stall of a busy machine comes between the
	// Complete and the replay that must come before the expiry.
	const ttl = 2 * time.Second
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	start := time.Now()
	f.complete(key, tok, textResponse("short"), ttl)
	res := f.wantBefore(start, ttl, key, fpA, storage.Replay)
	if msg := diffResponse(res.Record.Response, textResponse("short"), true); msg != "" {
		f.t.Fatalf("replay before expiry: %s", msg)
	}
	time.Sleep(time.Until(start.Add(ttl + lapse)))
	_, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get after expiry", err, storage.ErrNotFound)
	f.acquire(key, fpA, longLease)
}

func testLapsedLeaseIsTakenOver(f *fixture) {
	key := f.key()
	old := f.acquire(key, fpA, shortLease)
	time.Sleep(lapse)
	_, err := f.store.Get(f.ctx, key, false)
	f.wantErr("Get of lapsed lease", err, storage.ErrNotFound)

	// Even another request takes a lapsed key over: the record is gone.
	tok := f.acquire(key, fpB, longLease)
	if tok == old {
		f.t.Fatalf("takeover kept the lapsed token %d", tok)
	}
	rec, err := f.store.Get(f.ctx, key, false)
	f.wantErr("Get after takeover", err, nil)
	if rec.Token != tok || !bytes.Equal(rec.Fingerprint, fpB) {
		f.t.Fatalf("after takeover Get = token %d fingerprint %x, want %d %x", rec.Token, rec.Fingerprint, tok, fpB)
	}
}

func testStaleTokenCannotCompleteOrRelease(f *fixture) {
	key := f.key()
	old := f.acquire(key, fpA, shortLease)
	time.Sleep(lapse)
	tok := f.acquire(key, fpA, longLease)

	f.wantErr("stale Complete", f.store.Complete(f.ctx, key, old, textResponse("stale"), longTTL), storage.ErrLeaseLost)
	f.wantErr("stale Release", f.store.Release(f.ctx, key, old), storage.ErrLeaseLost)
	f.wantErr("stale Renew", f.store.Renew(f.ctx, key, old, longLease), storage.ErrLeaseLost)
	f.want(key, fpA, longLease, storage.Conflict)

	f.complete(key, tok, textResponse("owner"), longTTL)
	f.replays(key, fpA, textResponse("owner"))
	f.wantErr("stale Complete after completion", f.store.Complete(f.ctx, key, old, textResponse("stale"), longTTL), storage.ErrLeaseLost)
	f.replays(key, fpA, textResponse("owner"))
}

func testRenewKeepsLease(f *fixture) {
	// The lease is long next to any stall of a busy machine between a
	// renewal and the checks after it, and the renewals go on for twice
	// as long, so that without them it would have lapsed.
	const (
		lease = 2 * time.Second
		every = lease / 4
		hold  = 2 * lease
	)
	key := f.key()
	tok := f.acquire(key, fpA, lease)
	for end := time.Now().Add(hold); time.Now().Before(end); {
		time.Sleep(every)
		renewed := time.Now()
		f.wantErr("Renew", f.store.Renew(f.ctx, key, tok, lease), nil)
		// Another request, even for other content, must not get the key.
		f.wantBefore(renewed, lease, key, fpB, storage.Mismatch)
		f.wantBefore(renewed, lease, key, fpA, storage.Conflict)
	}
	// Without renewals the lease lapses: wait for it as for an event.
	testutil.Eventually(f.t, 30*time.Second, "the lease to lapse once no longer renewed", func() bool {
		return f.reserve(key, fpB, longLease).Outcome == storage.Acquired
	})
}

func testRenewAfterLapseWithoutTakeoverSucceeds(f *fixture) {
	renewed, completed := f.key(), f.key()
	t1 := f.acquire(renewed, fpA, shortLease)
	t2 := f.acquire(completed, fpA, shortLease)
	time.Sleep(lapse)

	// Only a takeover fences: nobody came, so the lease is still the owner's.
	f.wantErr("Renew after lapse", f.store.Renew(f.ctx, renewed, t1, longLease), nil)
	f.want(renewed, fpA, longLease, storage.Conflict)
	f.complete(renewed, t1, textResponse("renewed"), longTTL)
	f.replays(renewed, fpA, textResponse("renewed"))

	f.complete(completed, t2, textResponse("completed"), longTTL)
	f.replays(completed, fpA, textResponse("completed"))
}

package storagetest

import (
	"bytes"
	"net/http"
	"slices"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func testReserveNewKeyAcquires(f *fixture) {
	t1 := f.acquire(f.key(), fpA, longLease)
	t2 := f.acquire(f.key(), fpA, longLease)
	if t1 == t2 {
		f.t.Fatalf("two keys got the same token %d", t1)
	}
}

func testReserveSameFingerprintWhileInFlightConflicts(f *fixture) {
	key := f.key()
	fp := slices.Clone(fpA)
	before := time.Now()
	f.acquire(key, fp, longLease)
	after := time.Now()
	// The store must keep its own copy: callers reuse their buffers.
	fp[0]++

	rec := f.want(key, fpA, longLease, storage.Conflict).Record
	f.wantTime("conflict ExpiresAt", rec.ExpiresAt, before.Add(longLease), after.Add(longLease))
	// A conflicting Reserve neither takes the key nor extends the lease.
	rec = f.want(key, fpA, 2*longLease, storage.Conflict).Record
	f.wantTime("conflict ExpiresAt after another Reserve", rec.ExpiresAt, before.Add(longLease), after.Add(longLease))
}

func testReserveOtherFingerprintMismatches(f *fixture) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	// Mismatch is checked before in flight.
	f.want(key, fpB, longLease, storage.Mismatch)
	f.want(key, fpA, longLease, storage.Conflict)

	f.complete(key, tok, textResponse("done"), longTTL)
	f.want(key, fpB, longLease, storage.Mismatch)
	f.replays(key, fpA, textResponse("done"))

	// Fingerprints of other lengths are compared whole, not by prefix.
	f.want(key, fpA[:16], longLease, storage.Mismatch)
	f.want(key, append(slices.Clone(fpA), 0), longLease, storage.Mismatch)
}

func testReplayReturnsRecordedResponse(f *fixture) {
	key := f.key()
	before := time.Now()
	tok := f.acquire(key, fpA, longLease)
	beforeComplete := time.Now()
	f.complete(key, tok, sampleResponse(), longTTL)
	afterComplete := time.Now()

	for range 2 { // a replay must not consume the record
		rec := f.replays(key, fpA, sampleResponse())
		if !bytes.Equal(rec.Fingerprint, fpA) {
			f.t.Fatalf("replay Fingerprint %x, want %x", rec.Fingerprint, fpA)
		}
		f.wantTime("replay CreatedAt", rec.CreatedAt, before, beforeComplete)
		// The TTL counts from completion, not from the reservation.
		f.wantTime("replay ExpiresAt", rec.ExpiresAt, beforeComplete.Add(longTTL), afterComplete.Add(longTTL))
	}
}

func testEmptyBodyReplays(f *fixture) {
	for _, resp := range []*storage.Response{
		{Status: http.StatusNoContent},
		{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte{}},
	} {
		key := f.key()
		f.complete(key, f.acquire(key, fpA, longLease), resp, longTTL)
		f.replays(key, fpA, resp)
	}
}

func testBodyOmittedIsKept(f *fixture) {
	key := f.key()
	resp := &storage.Response{
		Status:      http.StatusOK,
		Header:      http.Header{"Content-Type": {"application/json"}},
		BodyOmitted: true,
	}
	f.complete(key, f.acquire(key, fpA, longLease), resp, longTTL)
	f.replays(key, fpA, resp)
	rec, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get", err, nil)
	if msg := diffResponse(rec.Response, resp, true); msg != "" {
		f.t.Fatalf("Get: %s", msg)
	}
}

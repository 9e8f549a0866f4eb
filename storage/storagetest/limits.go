package storagetest

import (
	"math"
	"strconv"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The edges of what a store takes: responses no record may hold, and
// durations far beyond any sensible configuration.

func testCompleteRefusesAResponseNoRecordMayHold(f *fixture) {
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	for _, resp := range []*storage.Response{
		nil,
		{Status: 0},
		{Status: 42, Body: []byte("HTTP/1.1 042 x")},
		{Status: 100},
		{Status: 199},
		{Status: 1000},
		{Status: -200},
	} {
		what := "Complete with a nil response"
		if resp != nil {
			what = "Complete with status " + strconv.Itoa(resp.Status)
		}
		f.wantErr(what, f.store.Complete(f.ctx, key, tok, resp, longTTL), storage.ErrInvalid)
	}
	// Nothing was recorded and the lease is still the caller's.
	rec, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get after refused Completes", err, nil)
	if rec.State != storage.InFlight || rec.Token != tok {
		f.t.Fatalf("after refused Completes Get = state %v token %d, want in flight with token %d", rec.State, rec.Token, tok)
	}
	f.want(key, fpA, longLease, storage.Conflict)
	f.complete(key, tok, &storage.Response{Status: 999}, longTTL)
	f.replays(key, fpA, &storage.Response{Status: 999})
}

// hugeDurations are leases and TTLs whose end overflows int64
// nanoseconds (or milliseconds doubled) when added naively: a store must
// clamp them (to storage.MaxDuration) rather than wrap around into the
// past.
var hugeDurations = []time.Duration{
	math.MaxInt64,
	106751 * 24 * time.Hour, // the largest whole number of days
	60000 * 24 * time.Hour,  // overflows a lease doubled for keeping
	storage.MaxDuration + time.Nanosecond,
}

func testHugeLeasesAndTTLsSaturate(f *fixture) {
	farOff := time.Now().Add(storage.MaxDuration / 2)
	for _, d := range hugeDurations {
		key := f.key()
		tok := f.acquire(key, fpA, d)
		rec := f.want(key, fpA, longLease, storage.Conflict).Record
		if rec.ExpiresAt.Before(farOff) {
			f.t.Fatalf("lease of %v: ExpiresAt %v, want after %v", d, rec.ExpiresAt, farOff)
		}
		f.want(key, fpB, longLease, storage.Mismatch)
		f.wantErr("Renew for "+d.String(), f.store.Renew(f.ctx, key, tok, d), nil)
		f.want(key, fpA, longLease, storage.Conflict)

		f.complete(key, tok, textResponse("kept"), d)
		rec = f.replays(key, fpA, textResponse("kept"))
		if rec.ExpiresAt.Before(farOff) {
			f.t.Fatalf("ttl of %v: ExpiresAt %v, want after %v", d, rec.ExpiresAt, farOff)
		}
		got, err := f.store.Get(f.ctx, key, false)
		f.wantErr("Get of a record kept for "+d.String(), err, nil)
		if got.State != storage.Completed {
			f.t.Fatalf("Get of a record kept for %v: state %v", d, got.State)
		}
	}
}

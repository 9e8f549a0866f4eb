package storagetest

import (
	"bytes"
	"slices"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// testMismatchCarriesTheDetail: a completed record keeps the Detail it was
// completed with and returns it, and nothing else, with a Mismatch; a
// replay does not need it, an in-flight record has none.
func testMismatchCarriesTheDetail(f *fixture) {
	detail := []byte("salt and digests \x00\x01\xff of the first request")
	key := f.key()
	tok := f.acquire(key, fpA, longLease)
	if res := f.want(key, fpB, longLease, storage.Mismatch); res.Record != nil {
		f.t.Fatalf("mismatch with an in-flight record: record %+v, want none", res.Record)
	}
	resp := &storage.Response{Status: 201, Body: []byte("done"), Detail: slices.Clone(detail)}
	f.complete(key, tok, resp, longTTL)
	resp.Detail[0] = 'X' // the store keeps its own copy
	res := f.want(key, fpB, longLease, storage.Mismatch)
	if res.Record == nil || !bytes.Equal(res.Record.Detail, detail) {
		f.t.Fatalf("mismatch with a completed record: record %+v, want Detail %q", res.Record, detail)
	}
	if rep := f.want(key, fpA, longLease, storage.Replay); string(rep.Record.Response.Body) != "done" || !bytes.Equal(rep.Record.Detail, detail) {
		f.t.Fatalf("replay body %q, Detail %q; want done and %q", rep.Record.Response.Body, rep.Record.Detail, detail)
	}
	// Again after the replay, which a caching store may have kept.
	if res := f.want(key, fpB, longLease, storage.Mismatch); res.Record == nil || !bytes.Equal(res.Record.Detail, detail) {
		f.t.Fatalf("mismatch after a replay: record %+v, want Detail %q", res.Record, detail)
	}

	// Without a Detail, a mismatch carries no record.
	plain := f.key()
	tok = f.acquire(plain, fpA, longLease)
	f.complete(plain, tok, &storage.Response{Status: 201}, longTTL)
	if res := f.want(plain, fpB, longLease, storage.Mismatch); res.Record != nil {
		f.t.Fatalf("mismatch with a record completed without detail: record %+v, want none", res.Record)
	}
}

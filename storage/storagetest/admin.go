package storagetest

import (
	"bytes"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

func testUnknownKeyOperations(f *fixture) {
	key := f.key()
	tok := storage.NewToken()
	f.wantErr("Complete", f.store.Complete(f.ctx, key, tok, textResponse("x"), longTTL), storage.ErrLeaseLost)
	f.wantErr("Release", f.store.Release(f.ctx, key, tok), storage.ErrLeaseLost)
	f.wantErr("Renew", f.store.Renew(f.ctx, key, tok, longLease), storage.ErrLeaseLost)
	_, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get", err, storage.ErrNotFound)
	f.wantErr("Delete", f.store.Delete(f.ctx, key), storage.ErrNotFound)
	// None of that created the key.
	f.acquire(key, fpA, longLease)
}

func testGetReturnsRecord(f *fixture) {
	key := f.key()
	before := time.Now()
	tok := f.acquire(key, fpA, longLease)
	after := time.Now()
	rec, err := f.store.Get(f.ctx, key, true)
	f.wantErr("Get in flight", err, nil)
	if rec.State != storage.InFlight || rec.Token != tok || !bytes.Equal(rec.Fingerprint, fpA) || rec.Response != nil {
		f.t.Fatalf("Get in flight = %+v, want state in_flight, token %d, fingerprint %x, no response", rec, tok, fpA)
	}
	f.wantTime("in-flight CreatedAt", rec.CreatedAt, before, after)
	f.wantTime("in-flight ExpiresAt", rec.ExpiresAt, before.Add(longLease), after.Add(longLease))

	beforeComplete := time.Now()
	f.complete(key, tok, sampleResponse(), longTTL)
	afterComplete := time.Now()
	for _, withBody := range []bool{false, true} {
		rec, err := f.store.Get(f.ctx, key, withBody)
		f.wantErr("Get completed", err, nil)
		if rec.State != storage.Completed || !bytes.Equal(rec.Fingerprint, fpA) {
			f.t.Fatalf("Get completed = state %v fingerprint %x, want completed %x", rec.State, rec.Fingerprint, fpA)
		}
		if msg := diffResponse(rec.Response, sampleResponse(), withBody); msg != "" {
			f.t.Fatalf("Get completed withBody=%v: %s", withBody, msg)
		}
		f.wantTime("completed CreatedAt", rec.CreatedAt, before, after)
		f.wantTime("completed ExpiresAt", rec.ExpiresAt, beforeComplete.Add(longTTL), afterComplete.Add(longTTL))
	}
	// Leaving the body out of one answer must not lose it.
	f.replays(key, fpA, sampleResponse())
}

func testDeleteRemovesRecord(f *fixture) {
	done := f.key()
	f.complete(done, f.acquire(done, fpA, longLease), textResponse("x"), longTTL)
	f.wantErr("Delete completed", f.store.Delete(f.ctx, done), nil)
	_, err := f.store.Get(f.ctx, done, false)
	f.wantErr("Get after Delete", err, storage.ErrNotFound)
	f.wantErr("second Delete", f.store.Delete(f.ctx, done), storage.ErrNotFound)
	f.acquire(done, fpB, longLease)

	running := f.key()
	tok := f.acquire(running, fpA, longLease)
	f.wantErr("Delete in flight", f.store.Delete(f.ctx, running), nil)
	// The owner lost its lease: its work must not land in the record.
	f.wantErr("Complete after Delete", f.store.Complete(f.ctx, running, tok, textResponse("x"), longTTL), storage.ErrLeaseLost)
	f.wantErr("Renew after Delete", f.store.Renew(f.ctx, running, tok, longLease), storage.ErrLeaseLost)
	f.wantErr("Release after Delete", f.store.Release(f.ctx, running, tok), storage.ErrLeaseLost)
	f.acquire(running, fpA, longLease)
}

func testScopesAreIsolated(f *fixture) {
	a := storage.Key{Scope: f.scope, ID: "same"}
	b := storage.Key{Scope: randomHex(16), ID: "same"}
	ta := f.acquire(a, fpA, longLease)
	tb := f.acquire(b, fpA, longLease)
	f.complete(a, ta, textResponse("a"), longTTL)
	f.want(b, fpA, longLease, storage.Conflict)
	f.complete(b, tb, textResponse("b"), longTTL)
	f.replays(a, fpA, textResponse("a"))
	f.replays(b, fpA, textResponse("b"))

	// Scope is opaque: joining scope and ID with a separator must not
	// make two keys one.
	f.acquire(storage.Key{Scope: f.scope + ":x", ID: "y"}, fpA, longLease)
	f.acquire(storage.Key{Scope: f.scope, ID: "x:y"}, fpA, longLease)
}

func testKeysWithOddBytes(f *fixture) {
	// The Caddy handler's scopes are hex SHA-256; IDs are any visible
	// ASCII. Colons and braces break naive Redis key building (and Cluster
	// hash tags), quotes and backslashes naive escaping, * ? [ ] % _ glob
	// and LIKE patterns.
	scope := randomHex(32)
	ids := []string{
		"with space",
		`"quoted"`,
		`back\slash\`,
		"colon:colon::",
		"{brace}",
		"{a}:{b}",
		"}{",
		"*?[]%_",
		"'; DROP TABLE idempotency_keys; --",
		strings.Repeat("k", 255),
		strings.Repeat(`{"\:`, 63) + "end",
	}
	for _, id := range ids {
		key := storage.Key{Scope: scope, ID: id}
		f.complete(key, f.acquire(key, fpA, longLease), textResponse(id), longTTL)
	}
	// Read back only after all are written, so that keys mapped onto one
	// would show.
	for _, id := range ids {
		key := storage.Key{Scope: scope, ID: id}
		f.replays(key, fpA, textResponse(id))
		rec, err := f.store.Get(f.ctx, key, true)
		f.wantErr("Get "+id, err, nil)
		if string(rec.Response.Body) != id {
			f.t.Fatalf("Get(%q) body %q", id, rec.Response.Body)
		}
	}
	for _, id := range ids {
		f.wantErr("Delete "+id, f.store.Delete(f.ctx, storage.Key{Scope: scope, ID: id}), nil)
	}
}

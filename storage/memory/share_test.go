package memory_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// How the memory store shares itself between clients (scopes): one heavy
// client is served while there is room, and no client can take more than
// about half of the store, so the others always have the rest.

// apiResponse is a typical API answer with the detail the Caddy module
// keeps: about 1 KiB in all.
func apiResponse(i int) *storage.Response {
	return &storage.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {fmt.Sprintf("/orders/%d", i)}},
		Body:   bytes.Repeat([]byte("x"), 800),
		Detail: bytes.Repeat([]byte("d"), 150),
	}
}

func scopeKey(scope string, i int) storage.Key {
	return storage.Key{Scope: scope, ID: fmt.Sprint(i)}
}

// reserveComplete reserves key and completes it with resp; it returns the
// Reserve's error (ErrFull, ErrScopeFull) rather than failing on it.
func reserveComplete(t *testing.T, s *memory.Store, key storage.Key, resp *storage.Response) error {
	t.Helper()
	res, err := s.Reserve(t.Context(), key, fp, time.Minute)
	if err != nil {
		return err
	}
	if res.Outcome != storage.Acquired {
		t.Fatalf("Reserve(%v) = %v, want acquired", key, res.Outcome)
	}
	if err := s.Complete(t.Context(), key, res.Token, resp, time.Hour); err != nil {
		t.Fatalf("Complete(%v): %v", key, err)
	}
	return nil
}

// TestOneHeavyClientWithDefaultOptionsIsNeverRefused: 25,000 new keys
// within ttl from one API client (a server-side integration under one
// credential) all run and replay; the fixed default of 10,000 keys per
// scope refused the rest with 429.
func TestOneHeavyClientWithDefaultOptionsIsNeverRefused(t *testing.T) {
	s := memory.New(memory.Options{})
	defer s.Close()
	const keys = 25_000
	for i := range keys {
		if err := reserveComplete(t, s, scopeKey("integration", i), apiResponse(i)); err != nil {
			t.Fatalf("key %d of one client: %v", i, err)
		}
	}
	for _, i := range []int{0, keys / 2, keys - 1} {
		res, err := s.Reserve(t.Context(), scopeKey("integration", i), fp, time.Minute)
		if err != nil || res.Outcome != storage.Replay || res.Record.Response.BodyOmitted || len(res.Record.Response.Body) != 800 {
			t.Fatalf("replay of key %d: %v, %v", i, res.Outcome, err)
		}
	}
}

// TestOneScopeCannotTakeMoreThanItsShareOfRecords: a scope may take
// keys while the store has room to spare, but not beyond half of it; then
// its share (a tenth) binds, other scopes are served up to theirs, and
// the store is never more than full.
func TestOneScopeCannotTakeMoreThanItsShareOfRecords(t *testing.T) {
	s := memory.New(memory.Options{MaxKeys: 100})
	defer s.Close()
	held := 0
	for ; ; held++ {
		err := reserveComplete(t, s, scopeKey("greedy", held), apiResponse(held))
		if errors.Is(err, storage.ErrScopeFull) {
			break
		}
		if err != nil || held > 100 {
			t.Fatalf("greedy key %d: %v", held, err)
		}
	}
	if held > 50 || held < 40 {
		t.Fatalf("one scope took %d of 100 records before it was refused, want less than half, and more than its share of 10 while there was room", held)
	}
	// Every other scope still gets its share of 10, until the others
	// have had the rest of the store.
	for c := 0; c < 10; c++ {
		scope := fmt.Sprint("client-", c)
		for i := range 10 {
			if err := reserveComplete(t, s, scopeKey(scope, i), apiResponse(i)); err != nil {
				if errors.Is(err, storage.ErrFull) && s.Len() == 100 {
					return
				}
				t.Fatalf("%s key %d beside the greedy scope: %v", scope, i, err)
			}
		}
		if err := reserveComplete(t, s, scopeKey(scope, 10), apiResponse(10)); !errors.Is(err, storage.ErrScopeFull) {
			t.Fatalf("%s beyond its share under pressure: %v, want ErrScopeFull", scope, err)
		}
	}
	t.Fatalf("Len = %d: scopes of 10 beside %d never filled 100", s.Len(), held)
}

// TestOneScopeCannotTakeMoreThanItsShareOfBytes: large responses fill
// the bytes before the records; one scope stops at about half the bytes,
// and another is still served: its records keep their bodies up to its
// share, and beyond it, status and headers only (the request ran; it must
// never run twice).
func TestOneScopeCannotTakeMoreThanItsShareOfBytes(t *testing.T) {
	const maxBytes = 1 << 20
	s := memory.New(memory.Options{MaxKeys: 1000, MaxKeysPerScope: 100, MaxBytes: maxBytes}) // share: 100 KiB
	defer s.Close()
	large := func() *storage.Response {
		return &storage.Response{Status: http.StatusOK, Body: bytes.Repeat([]byte("y"), 16<<10)}
	}
	for i := 0; ; i++ {
		err := reserveComplete(t, s, scopeKey("greedy", i), large())
		if errors.Is(err, storage.ErrScopeFull) {
			break
		}
		if err != nil || i > 100 {
			t.Fatalf("greedy key %d: %v", i, err)
		}
	}
	greedy := s.Bytes()
	if greedy > maxBytes/2+(17<<10) {
		t.Fatalf("one scope took %d of %d bytes", greedy, maxBytes)
	}
	var kept, omitted int
	for i := range 10 {
		key := scopeKey("other", i)
		if err := reserveComplete(t, s, key, large()); err != nil {
			t.Fatalf("other scope, key %d: %v", i, err)
		}
		res, err := s.Reserve(t.Context(), key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Replay {
			t.Fatalf("replay of the other scope's key %d: %v, %v", i, res.Outcome, err)
		}
		if res.Record.Response.BodyOmitted {
			omitted++
		} else {
			kept++
		}
	}
	if kept < 5 || omitted == 0 {
		t.Fatalf("the other scope kept %d bodies of 16 KiB and omitted %d; want its share of 100 KiB kept, the rest omitted", kept, omitted)
	}
}

// TestMaxBytesHoldsWithLargeRecords fills a store that has no per-scope
// share with records of 200 KiB: the bytes never exceed MaxBytes by more
// than the status lines of the records completed past it, whose bodies
// are not kept; new keys are then refused with ErrFull until records
// expire.
func TestMaxBytesHoldsWithLargeRecords(t *testing.T) {
	const maxBytes = 1 << 20
	var clock memory.Clock
	s := memory.NewWithClock(memory.Options{MaxKeysPerScope: -1, MaxBytes: maxBytes}, &clock)
	defer s.Close()
	body := bytes.Repeat([]byte("z"), 200<<10)
	var omitted, i int
	for ; ; i++ {
		err := reserveComplete(t, s, key(i), &storage.Response{Status: http.StatusOK, Body: body})
		if b := s.Bytes(); b > maxBytes+int64(16*(omitted+1)) {
			t.Fatalf("after %d records: %d bytes, beyond MaxBytes %d", i, b, maxBytes)
		}
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil || i > 100_000 {
			t.Fatalf("key %d: %v", i, err)
		}
		if res, _ := s.Reserve(t.Context(), key(i), fp, time.Minute); res.Record.Response.BodyOmitted {
			omitted++
		}
	}
	if i-omitted != 5 || omitted == 0 {
		t.Fatalf("%d records of 200 KiB kept their body in 1 MiB and %d did not; want 5 and the rest", i-omitted, omitted)
	}
	// Once records expire, there is room again.
	clock.Advance(time.Hour)
	if err := reserveComplete(t, s, key(i), &storage.Response{Status: http.StatusOK, Body: body}); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if res, _ := s.Reserve(t.Context(), key(i), fp, time.Minute); res.Record.Response.BodyOmitted {
		t.Fatal("after expiry, a record's body was not kept")
	}
}

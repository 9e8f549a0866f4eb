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

// Refusal records (status 400-499) give way under pressure: a full store
// evicts its oldest ones for a new key, a scope past its share its own
// oldest one; records in flight and records of other statuses never
// give way.

func statusResponse(status int) *storage.Response {
	return &storage.Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"x"}`)}
}

// wantReplay fails unless key replays status.
func wantReplay(t *testing.T, s *memory.Store, key storage.Key, status int) {
	t.Helper()
	res, err := s.Reserve(t.Context(), key, fp, time.Minute)
	if err != nil || res.Outcome != storage.Replay || res.Record.Response.Status != status {
		t.Fatalf("Reserve(%v) = %v, %v; want a replay of %d", key, res.Outcome, err, status)
	}
}

// wantGone fails unless key has no record.
func wantGone(t *testing.T, s *memory.Store, key storage.Key) {
	t.Helper()
	if _, err := s.Get(t.Context(), key, false); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get(%v) = %v, want ErrNotFound: the record should have given way", key, err)
	}
}

// TestRefusalsGiveWayToANewKey is the outside review's case: made-up
// credentials, each one a scope of its own, whose requests the upstream
// answers 404, fill max_keys 100 with 100 records; a real client's new
// key used to get ErrFull (503 store-full). The oldest refusal records
// give way, one per new key, and the newer ones still replay.
func TestRefusalsGiveWayToANewKey(t *testing.T) {
	s := memory.New(memory.Options{MaxKeys: 100})
	defer s.Close()
	made := func(i int) storage.Key { return storage.Key{Scope: fmt.Sprint("made-up-", i), ID: "k"} }
	for i := range 100 {
		if err := reserveComplete(t, s, made(i), statusResponse(http.StatusNotFound)); err != nil {
			t.Fatalf("made-up credential %d: %v", i, err)
		}
	}
	if n := s.Len(); n != 100 {
		t.Fatalf("Len = %d, want the store full", n)
	}
	for i := range 5 {
		key := storage.Key{Scope: "real-client", ID: fmt.Sprint(i)}
		res, err := s.Reserve(t.Context(), key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("the real client's new key %d: %v, %v; want Acquired", i, res.Outcome, err)
		}
		wantGone(t, s, made(i))
	}
	if n, ev := s.Len(), s.EvictedRefusals(); n != 100 || ev != 5 {
		t.Fatalf("Len = %d, %d evicted; want 100 and 5", n, ev)
	}
	for _, i := range []int{5, 50, 99} {
		wantReplay(t, s, made(i), http.StatusNotFound)
	}
}

// TestRecordsInFlightAndOfOtherStatusesNeverGiveWay: of a full store of
// records in flight and completed with 200, 301 and 500 (a release_on
// that records 5xx), and one 404, a new key takes the 404's place, and
// the next one gets ErrFull; every other record is still there.
func TestRecordsInFlightAndOfOtherStatusesNeverGiveWay(t *testing.T) {
	s := memory.New(memory.Options{MaxKeys: 10, MaxKeysPerScope: -1})
	defer s.Close()
	statuses := []int{200, 200, 301, 500, 201, 422}
	for i, st := range statuses {
		if err := reserveComplete(t, s, key(i), statusResponse(st)); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(statuses); i < 10; i++ { // in flight
		if res, err := s.Reserve(t.Context(), key(i), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("Reserve(%d) = %v, %v", i, res.Outcome, err)
		}
	}
	if res, err := s.Reserve(t.Context(), key(10), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("a new key with one refusal record held: %v, %v; want Acquired", res.Outcome, err)
	}
	wantGone(t, s, key(5)) // the 422
	for range 3 {
		if _, err := s.Reserve(t.Context(), key(11), fp, time.Minute); !errors.Is(err, storage.ErrFull) {
			t.Fatalf("a new key with no refusal record held: %v, want ErrFull", err)
		}
	}
	for i, st := range statuses[:5] {
		wantReplay(t, s, key(i), st)
	}
	for i := 6; i <= 10; i++ {
		if res, err := s.Reserve(t.Context(), key(i), fp, time.Minute); err != nil || res.Outcome != storage.Conflict {
			t.Fatalf("key %d in flight: %v, %v; want Conflict", i, res.Outcome, err)
		}
	}
	if ev := s.EvictedRefusals(); ev != 1 {
		t.Fatalf("%d evicted, want 1", ev)
	}
}

// TestRefusalsGiveWayUnderMaxBytes: 404s with bodies of 16 KiB from
// many scopes, beside 2xx records taking half of max_bytes, go on being
// served well past max_bytes: the oldest 404s give way for each new key
// while the bytes stay within max_bytes, and every 2xx record keeps its
// body. Once no refusal record is left, a new key gets ErrFull.
func TestRefusalsGiveWayUnderMaxBytes(t *testing.T) {
	const maxBytes = 1 << 20
	s := memory.New(memory.Options{MaxKeysPerScope: -1, MaxBytes: maxBytes})
	defer s.Close()
	body := bytes.Repeat([]byte("z"), 16<<10)
	const kept = 30 // about half of max_bytes
	for i := range kept {
		if err := reserveComplete(t, s, key(i), &storage.Response{Status: http.StatusCreated, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(i int) storage.Key { return storage.Key{Scope: fmt.Sprint("made-up-", i), ID: "k"} }
	const refusals = 200 // three times what max_bytes holds
	for i := range refusals {
		if err := reserveComplete(t, s, refused(i), &storage.Response{Status: http.StatusNotFound, Body: body}); err != nil {
			t.Fatalf("refusal %d: %v", i, err)
		}
		if b := s.Bytes(); b > maxBytes+64 {
			t.Fatalf("after refusal %d: %d bytes, beyond max_bytes %d", i, b, maxBytes)
		}
	}
	if s.EvictedRefusals() == 0 {
		t.Fatal("no refusal record gave way")
	}
	wantGone(t, s, refused(0))
	wantReplay(t, s, refused(refusals-1), http.StatusNotFound)
	for i := range kept {
		res, err := s.Reserve(t.Context(), key(i), fp, time.Minute)
		if err != nil || res.Outcome != storage.Replay || len(res.Record.Response.Body) != len(body) {
			t.Fatalf("2xx record %d: %v, %v; want a replay with its body", i, res.Outcome, err)
		}
	}
	// New keys of 2xx records take the room of the refusal records left,
	// then the store is full.
	for i := kept; ; i++ {
		err := reserveComplete(t, s, key(i), &storage.Response{Status: http.StatusCreated, Body: body})
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil || i > 100_000 {
			t.Fatalf("2xx record %d: %v", i, err)
		}
	}
	for i := range refusals {
		if _, err := s.Get(t.Context(), refused(i), false); err == nil {
			t.Fatalf("refusal %d is still held by a full store", i)
		}
	}
}

// TestAScopePastItsShareGivesWayItsOwnRefusals: under pressure, a scope
// at its share whose records include refusals gets a new key in place of
// its own oldest refusal record, not another scope's; a scope at its
// share of 2xx records or records in flight still gets ErrScopeFull.
func TestAScopePastItsShareGivesWayItsOwnRefusals(t *testing.T) {
	s := memory.New(memory.Options{MaxKeys: 100, MaxKeysPerScope: 10})
	defer s.Close()
	// Pressure: half of the store, among them another scope's refusal.
	for i := range 49 {
		if err := reserveComplete(t, s, storage.Key{Scope: fmt.Sprint("filler-", i), ID: "k"}, statusResponse(http.StatusCreated)); err != nil {
			t.Fatal(err)
		}
	}
	other := storage.Key{Scope: "other", ID: "refused"}
	if err := reserveComplete(t, s, other, statusResponse(http.StatusNotFound)); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := reserveComplete(t, s, scopeKey("refused", i), statusResponse(http.StatusUnprocessableEntity)); err != nil {
			t.Fatalf("refused scope, key %d: %v", i, err)
		}
		if err := reserveComplete(t, s, scopeKey("served", i), statusResponse(http.StatusCreated)); err != nil {
			t.Fatalf("served scope, key %d: %v", i, err)
		}
		if res, err := s.Reserve(t.Context(), scopeKey("running", i), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
			t.Fatalf("running scope, key %d: %v, %v", i, res.Outcome, err)
		}
	}
	if res, err := s.Reserve(t.Context(), scopeKey("refused", 10), fp, time.Minute); err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("a new key of a scope at its share of refusals: %v, %v; want Acquired", res.Outcome, err)
	}
	wantGone(t, s, scopeKey("refused", 0))
	wantReplay(t, s, scopeKey("refused", 9), http.StatusUnprocessableEntity)
	wantReplay(t, s, other, http.StatusNotFound)
	for _, scope := range []string{"served", "running"} {
		if _, err := s.Reserve(t.Context(), scopeKey(scope, 10), fp, time.Minute); !errors.Is(err, storage.ErrScopeFull) {
			t.Fatalf("a new key of the %s scope at its share: %v, want ErrScopeFull", scope, err)
		}
	}
	if ev := s.EvictedRefusals(); ev != 1 {
		t.Fatalf("%d evicted, want 1", ev)
	}
}

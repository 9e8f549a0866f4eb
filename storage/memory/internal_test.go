package memory

import (
	"slices"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// lapseNow makes key's lease lapse at once, without sleeping through it and
// without the Wait timer, which is bounded by the lease, waking anyone.
func lapseNow(s *Store, key storage.Key) {
	sh, id := s.shardFor(key)
	sh.mu.Lock()
	sh.m[id].expires = s.now() - 1
	sh.mu.Unlock()
}

// Listening implements storagetest.WaitProbe for the conformance suite
// (memory_test.go): a Wait call listens once it has made the record's
// done channel.
func (s *Store) Listening(key storage.Key) bool { return waiting(s, key) }

// waiting reports whether someone waits on key.
func waiting(s *Store, key storage.Key) bool {
	sh, id := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[id]
	return e != nil && e.done != nil
}

// checkCount fails unless the record count, the bytes and the per-scope
// counts match the shards' contents. The store must be idle.
func checkCount(t *testing.T, s *Store) {
	t.Helper()
	n, bytes := 0, int64(0)
	scopes := make(map[scopeID]scopeUse)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		for _, e := range sh.m {
			bytes += e.footprint()
			u := scopes[e.scope]
			u.n++
			u.bytes += e.footprint()
			scopes[e.scope] = u
		}
		sh.mu.Unlock()
	}
	if got := s.Len(); got != n {
		t.Fatalf("Len = %d, shards hold %d", got, n)
	}
	if got := s.Bytes(); got != bytes {
		t.Fatalf("Bytes = %d, the shards' records take %d", got, bytes)
	}
	checkRefusals(t, s)
	if s.maxScope == 0 {
		return
	}
	counted := make(map[scopeID]scopeUse)
	for i := range s.scopes {
		sc := &s.scopes[i]
		sc.mu.Lock()
		for id, u := range sc.m {
			counted[id] = u
		}
		sc.mu.Unlock()
	}
	if len(counted) != len(scopes) {
		t.Fatalf("%d scopes counted, records of %d held", len(counted), len(scopes))
	}
	for id, u := range scopes {
		if counted[id] != u {
			t.Fatalf("scope %x counted %+v, holds %+v", id, counted[id], u)
		}
	}
}

// checkRefusals fails unless the refusal lists hold exactly the refusal
// records the shards hold, each at the place its entry keeps, the store's
// list from the oldest and each scope's list in the same order, and every
// other node is free. The store must be idle.
func checkRefusals(t *testing.T, s *Store) {
	t.Helper()
	r := &s.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[int32]recordID{} // node -> record, from the shards
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for id, e := range sh.m {
			if e.isRefusal() {
				want[int32(e.token-1)] = id
				if st, err := storage.DecodeResponse(e.resp); err != nil || !refusal(st.Status) {
					t.Errorf("record %x on the refusal lists holds %v, %v", id[:4], st, err)
				}
			} else if e.resp != nil && e.token != 0 {
				t.Errorf("completed record %x keeps token %d", id[:4], e.token)
			}
		}
		sh.mu.Unlock()
	}
	if r.n != len(want) {
		t.Fatalf("%d nodes in use, the shards hold %d refusal records", r.n, len(want))
	}
	// The store's list, from the oldest.
	var order []int32
	prev := int32(none)
	for at := r.all.head; at != none; at = r.nodes[at].all.next {
		nd := r.nodes[at]
		if nd.all.prev != prev {
			t.Fatalf("node %d: prev %d, want %d", at, nd.all.prev, prev)
		}
		if id, ok := want[at]; !ok || id != nd.id {
			t.Fatalf("node %d names record %x, which does not keep it", at, nd.id[:4])
		}
		order = append(order, at)
		prev = at
		if len(order) > len(r.nodes) {
			t.Fatal("the store's refusal list loops")
		}
	}
	if r.all.tail != prev || len(order) != r.n {
		t.Fatalf("the store's list: tail %d (want %d), %d nodes (want %d)", r.all.tail, prev, len(order), r.n)
	}
	// Each scope's list: its nodes, in the store's order.
	if r.scopes != nil {
		byScope := map[scopeID][]int32{}
		for _, at := range order {
			byScope[r.nodes[at].scope] = append(byScope[r.nodes[at].scope], at)
		}
		if len(byScope) != len(r.scopes) {
			t.Fatalf("%d scope lists, %d scopes hold refusal records", len(r.scopes), len(byScope))
		}
		for scope, l := range r.scopes {
			var got []int32
			prev := int32(none)
			for at := l.head; at != none; at = r.nodes[at].own.next {
				if r.nodes[at].own.prev != prev || r.nodes[at].scope != scope {
					t.Fatalf("scope %x: node %d misplaced", scope, at)
				}
				got = append(got, at)
				prev = at
			}
			if l.tail != prev || !slices.Equal(got, byScope[scope]) {
				t.Fatalf("scope %x lists %v, want %v", scope, got, byScope[scope])
			}
		}
	}
	free := 0
	for at := r.free; at != none; at = r.nodes[at].all.next {
		if _, used := want[at]; used {
			t.Fatalf("node %d is both free and in use", at)
		}
		free++
	}
	if free+r.n != len(r.nodes) {
		t.Fatalf("%d nodes free, %d in use, %d in all", free, r.n, len(r.nodes))
	}
}

// wakesWaiter fails unless act, run while someone waits on key's lease of a
// minute, wakes the waiter promptly.
func wakesWaiter(t *testing.T, act func(s *Store, key storage.Key)) {
	s := New(Options{})
	defer s.Close()
	key := storage.Key{Scope: "s", ID: "k"}
	if _, err := s.Reserve(t.Context(), key, []byte("fp"), time.Minute); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- s.Wait(t.Context(), key, time.Minute) }()
	for !waiting(s, key) {
		time.Sleep(time.Millisecond)
	}
	act(s, key)
	select {
	case err := <-woke:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(20 * time.Second): // well before maxWait
		t.Fatal("waiter not woken")
	}
	checkCount(t, s)
}

func TestWaiterWakesOnSweep(t *testing.T) {
	wakesWaiter(t, func(s *Store, key storage.Key) {
		lapseNow(s, key)
		s.sweep()
		if n := s.Len(); n != 0 {
			t.Errorf("Len after sweep = %d", n)
		}
	})
}

func TestCloseStopsJanitor(t *testing.T) {
	s := New(Options{JanitorInterval: time.Millisecond})
	time.Sleep(5 * time.Millisecond) // let the janitor run a few sweeps
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.janitorDone: // Close waited for the janitor to return
	default:
		t.Fatal("the janitor goroutine is still running after Close")
	}
}

package idempotency

import (
	"bytes"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// slowUpstream answers 201 with a body after a pause, so that concurrent
// requests overlap the first one.
func slowUpstream(pause time.Duration) *upstream {
	return &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(pause)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id":"ord_1"}`))
		return err
	}}
}

// fire sends n identical requests at once and returns their responses.
func fire(h *Handler, up *upstream, n int, key, body string) []*responseSnapshot {
	return alternate(h, h, up, n, key, body)
}

type responseSnapshot struct {
	code   int
	header http.Header
	body   []byte
}

// TestConcurrentSameKeyRunsOnce fires 100 requests with one key at once:
// the upstream must run exactly once, one client gets its response and
// every other one a 409 (with Retry-After) or an identical replay.
func TestConcurrentSameKeyRunsOnce(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{})
		up := slowUpstream(100 * time.Millisecond)
		responses := fire(h, up, 100, "order-1", `{"amount":10}`)

		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times for 100 concurrent requests, want exactly 1", n)
		}
		var created, conflicts, replays int
		for _, r := range responses {
			switch {
			case r.code == http.StatusConflict:
				conflicts++
				if r.header.Get("Retry-After") == "" {
					t.Error("409 without Retry-After")
				}
			case r.code == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true":
				replays++
				if !bytes.Equal(r.body, []byte(`{"id":"ord_1"}`)) {
					t.Errorf("replay body %q", r.body)
				}
			case r.code == http.StatusCreated:
				created++
			default:
				t.Errorf("unexpected response %d %q", r.code, r.body)
			}
		}
		if created != 1 || conflicts+replays != 99 {
			t.Fatalf("created %d, conflicts %d, replays %d; want 1 created and 99 others", created, conflicts, replays)
		}
	})
}

func TestConcurrentSameKeyWaitModeAllGetTheResponse(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{InFlight: "wait", WaitTimeout: caddy.Duration(10 * time.Second)})
		up := slowUpstream(200 * time.Millisecond)
		responses := fire(h, up, 100, "order-1", `{"amount":10}`)

		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want exactly 1", n)
		}
		replays := 0
		for _, r := range responses {
			if r.code != http.StatusCreated || !bytes.Equal(r.body, []byte(`{"id":"ord_1"}`)) {
				t.Fatalf("wait mode: got %d %q, want every request to get the 201", r.code, r.body)
			}
			if r.header.Get("Idempotent-Replayed") == "true" {
				replays++
			}
		}
		if replays != 99 {
			t.Fatalf("%d replays, want 99", replays)
		}
	})
}

func TestWaitModeTimesOutWithConflict(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{InFlight: "wait", WaitTimeout: caddy.Duration(100 * time.Millisecond)})
		up := slowUpstream(time.Second)
		first := make(chan struct{})
		go func() { serve(h, up, request("k", "{}")); close(first) }()
		defer func() { <-first }()
		testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.calls.Load() == 1 })
		began := time.Now()
		w := serve(h, up, request("k", "{}"))
		if w.Code != http.StatusConflict {
			t.Fatalf("after wait_timeout: %d, want 409", w.Code)
		}
		if waited := time.Since(began); waited < 100*time.Millisecond {
			t.Fatalf("returned after %v, before wait_timeout", waited)
		}
	})
}

func TestWaitersBeyondTheCapGet409AtOnce(t *testing.T) {
	defer func(n int32) { maxWaiters = n }(maxWaiters)
	maxWaiters = 1
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release, done := holdInFlight(h, request("k", "{}"))
	waiter := make(chan int)
	go func() { waiter <- serve(h, up, request("k", "{}")).Code }()
	testutil.Eventually(t, 5*time.Second, "the first waiter to wait", func() bool { return atomic.LoadInt32(&h.waiting) == 1 })
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a waiter past the cap: %d %v, want 409 at once", w.Code, w.Header())
	}
	release()
	<-done
	if code := <-waiter; code != http.StatusCreated {
		t.Fatalf("the waiter within the cap got %d, want the replayed 201", code)
	}
	if atomic.LoadInt32(&h.waiting) != 0 {
		t.Fatalf("%d waiters left counted", h.waiting)
	}
}

func TestWaitModeRunsWhenTheFirstIsReleased(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{InFlight: "wait"})
		var mu sync.Mutex
		fail := true
		up := &upstream{}
		up.serve = func(w http.ResponseWriter, r *http.Request) error {
			mu.Lock()
			f := fail
			fail = false
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			if f {
				w.WriteHeader(http.StatusServiceUnavailable)
				return nil
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		}
		first := make(chan int)
		go func() { first <- serve(h, up, request("k", "{}")).Code }()
		testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.calls.Load() == 1 })
		second := serve(h, up, request("k", "{}"))
		if code := <-first; code != http.StatusServiceUnavailable {
			t.Fatalf("first: %d", code)
		}
		if second.Code != http.StatusCreated || second.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("waiter after a released key: %d replayed=%q; want it to run itself", second.Code, second.Header().Get("Idempotent-Replayed"))
		}
		if up.calls.Load() != 2 {
			t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
		}
	})
}

func TestLongRequestKeepsItsLease(t *testing.T) {
	// The upstream takes 3x lock_timeout: without renewal a retry would
	// take the key over and run it a second time.
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{LockTimeout: caddy.Duration(time.Second), InFlight: inFlightReject})
		up := slowUpstream(3 * time.Second)
		done := make(chan struct{})
		go func() { serve(h, up, request("k", "{}")); close(done) }()
		testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.calls.Load() == 1 })
		for range 6 {
			time.Sleep(400 * time.Millisecond)
			select {
			case <-done:
			default:
				if w := serve(h, up, request("k", "{}")); w.Code != http.StatusConflict {
					t.Fatalf("retry during the long request: %d, want 409", w.Code)
				}
			}
		}
		<-done
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	})
}

func TestDistinctKeysRunConcurrently(t *testing.T) {
	backends(t).run(func(t *testing.T, b *testStore) {
		h := b.handler(t, &Handler{})
		up := slowUpstream(50 * time.Millisecond)
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				key := "key-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
				if w := serve(h, up, request(key, "{}")); w.Code != http.StatusCreated {
					t.Errorf("%s: %d", key, w.Code)
				}
			})
		}
		wg.Wait()
		if up.calls.Load() != 50 {
			t.Fatalf("upstream ran %d times, want 50", up.calls.Load())
		}
	})
}

// twoInstances provisions h1 and h2 on b's namespace as two Caddy
// instances would be: same records, a client or pool each.
func twoInstances(t *testing.T, b *testStore, h1, h2 *Handler) (*Handler, *Handler) {
	t.Helper()
	x, y := b.instance(t, h1, 1), b.instance(t, h2, 2)
	if x.rawStore() == y.rawStore() {
		t.Fatal("the two instances share a store; want a client or pool each")
	}
	return x, y
}

// alternate sends n identical requests at once, alternating between x
// and y, and returns their responses.
func alternate(x, y *Handler, up *upstream, n int, key, body string) []*responseSnapshot {
	var wg sync.WaitGroup
	start := make(chan struct{})
	out := make([]*responseSnapshot, n)
	for i := range n {
		h := x
		if i%2 == 1 {
			h = y
		}
		wg.Go(func() {
			<-start
			w := serve(h, up, request(key, body))
			out[i] = &responseSnapshot{code: w.Code, header: w.Header(), body: w.Body.Bytes()}
		})
	}
	close(start)
	wg.Wait()
	return out
}

func TestTwoInstancesShareKeys(t *testing.T) {
	sharedBackends(t).run(func(t *testing.T, b *testStore) {
		x, y := twoInstances(t, b, &Handler{}, &Handler{})
		up := slowUpstream(200 * time.Millisecond)
		responses := alternate(x, y, up, 40, "shared-key", `{"x":1}`)
		if c := up.calls.Load(); c != 1 {
			t.Fatalf("upstream ran %d times across two instances, want 1", c)
		}
		created := 0
		for i, r := range responses {
			switch {
			case r.code == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
				created++
			case r.code == http.StatusCreated, r.code == http.StatusConflict:
			default:
				t.Errorf("request %d: %d", i, r.code)
			}
		}
		if created != 1 {
			t.Fatalf("%d requests got the upstream's response fresh, want 1", created)
		}
		// Either instance replays what the other recorded.
		for _, h := range []*Handler{x, y} {
			if w := serve(h, up, request("shared-key", `{"x":1}`)); w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("no replay after the race: %d", w.Code)
			}
		}
	})
}

func TestWaitAcrossInstances(t *testing.T) {
	sharedBackends(t).run(func(t *testing.T, b *testStore) {
		wait := func() *Handler { return &Handler{InFlight: "wait", WaitTimeout: caddy.Duration(10 * time.Second)} }
		x, y := twoInstances(t, b, wait(), wait())
		up := slowUpstream(300 * time.Millisecond)
		const n = 50
		began := time.Now()
		responses := alternate(x, y, up, n, "waited-key", `{"x":1}`)
		took := time.Since(began)
		if c := up.calls.Load(); c != 1 {
			t.Fatalf("upstream ran %d times, want 1", c)
		}
		replays := 0
		for i, r := range responses {
			if r.code != http.StatusCreated || string(r.body) != `{"id":"ord_1"}` {
				t.Fatalf("request %d: %d %q, want every waiter to get the 201", i, r.code, r.body)
			}
			if r.header.Get("Idempotent-Replayed") == "true" {
				replays++
			}
		}
		if replays != n-1 {
			t.Fatalf("%d replays, want %d", replays, n-1)
		}
		// Notified (Redis) or polled with a backoff capped at 250ms
		// (PostgreSQL): never at the handler's 1s wait granularity.
		if took > 2*time.Second {
			t.Errorf("waiters took %v for a 300ms request", took)
		}
	})
}

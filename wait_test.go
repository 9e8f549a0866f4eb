package idempotency

import (
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

func TestPreferredWait(t *testing.T) {
	for header, want := range map[string]time.Duration{
		"wait=5":                   5 * time.Second,
		"respond-async, wait=10":   10 * time.Second,
		`WAIT="3"`:                 3 * time.Second,
		"wait=2; foo=bar":          2 * time.Second,
		"handling=lenient, wait=0": 0,
		"return=minimal":           -1,
		"wait":                     -1,
		"wait=soon":                -1,
		"wait=-1":                  -1,
		"waiting=5":                -1,
		// Beyond any wait_timeout: as long as allowed (waitFor caps it).
		"wait=99999999999999999999": math.MaxInt32 * time.Second,
		"wait=4294967296":           math.MaxInt32 * time.Second,
	} {
		got, ok := preferredWait(http.Header{"Prefer": {header}})
		if (want < 0 && ok) || (want >= 0 && (!ok || got != want)) {
			t.Errorf("Prefer: %s = %v, %v; want %v", header, got, ok, want)
		}
	}
}

func TestWaitIsTheLesserOfPreferenceAndWaitTimeout(t *testing.T) {
	h := isolated(t, &Handler{InFlight: inFlightReject, WaitTimeout: caddy.Duration(3 * time.Second)})
	r := request("k", "{}")
	r.Header.Set("Prefer", "wait=30")
	if wait, asked := h.waitFor(r); wait != 3*time.Second || !asked {
		t.Errorf("wait=30 under wait_timeout 3s: %v %v", wait, asked)
	}
	if wait, _ := h.waitFor(request("k", "{}")); wait != 0 {
		t.Errorf("no preference on a reject route: waits %v", wait)
	}
	w := isolated(t, &Handler{WaitTimeout: caddy.Duration(3 * time.Second)}) // wait: the default
	if wait, asked := w.waitFor(request("k", "{}")); wait != 3*time.Second || asked {
		t.Errorf("no preference on a wait route: %v %v", wait, asked)
	}
	r.Header.Set("Prefer", "wait=0")
	if wait, _ := w.waitFor(r); wait != 0 {
		t.Errorf("wait=0 on a wait route: waits %v", wait)
	}
}

// heldUpstream holds every request until release, and counts them.
func heldUpstream() (up *upstream, release func()) {
	proceed := make(chan struct{})
	up = &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		<-proceed
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	var once sync.Once
	return up, func() { once.Do(func() { close(proceed) }) }
}

// TestOneKeysWaitersTakeOnlyItsShareOfThePlaces: past knobs.MaxWaitersPerKey,
// a retry of that key gets 409 at once, while a retry of another key in
// flight still finds a place and waits.
func TestOneKeysWaitersTakeOnlyItsShareOfThePlaces(t *testing.T) {
	defer knobs.MaxWaiters.Store(knobs.MaxWaiters.Load())
	defer knobs.MaxWaitersPerKey.Store(knobs.MaxWaitersPerKey.Load())
	knobs.MaxWaiters.Store(3)
	knobs.MaxWaitersPerKey.Store(2)
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release := heldUpstream()
	defer release()
	var wg sync.WaitGroup
	codes := make(chan int, 6)
	send := func(key string) { wg.Go(func() { codes <- serve(h, up, request(key, "{}")).Code }) }
	send("storm")
	send("other")
	testutil.Eventually(t, 5*time.Second, "both first requests to run", func() bool { return up.Calls.Load() == 2 })
	send("storm")
	send("storm")
	testutil.Eventually(t, 5*time.Second, "two retries of the storm's key to wait", func() bool { n, _ := h.waiters.waiting(); return n == 2 })
	if w := serve(h, up, request("storm", "{}")); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a third retry of the storm's key: %d %v, want 409 at once", w.Code, w.Header())
	}
	send("other")
	testutil.Eventually(t, 5*time.Second, "the other key's retry to wait", func() bool { n, _ := h.waiters.waiting(); return n == 3 })
	release()
	endWaiting(t, h, &wg, codes)
	if n := up.Calls.Load(); n != 2 {
		t.Errorf("the upstream ran %d times, want once per key", n)
	}
}

// TestOneClientsWaitersTakeOnlyItsShareOfThePlaces is the review's
// finding: one client's retries of many keys in flight (each under the
// per-key bound) took every place, and every other client's retry got
// 409 at once. Past knobs.MaxWaitersPerScope, that client's next retry
// gets 409, while another client's retry still waits.
func TestOneClientsWaitersTakeOnlyItsShareOfThePlaces(t *testing.T) {
	defer knobs.MaxWaiters.Store(knobs.MaxWaiters.Load())
	defer knobs.MaxWaitersPerScope.Store(knobs.MaxWaitersPerScope.Load())
	knobs.MaxWaiters.Store(4)
	knobs.MaxWaitersPerScope.Store(2)
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release := heldUpstream()
	defer release()
	as := func(client, key string) *http.Request {
		r := request(key, "{}")
		r.Header.Set("Authorization", "Bearer "+client)
		return r
	}
	var wg sync.WaitGroup
	codes := make(chan int, 8)
	send := func(client, key string) { wg.Go(func() { codes <- serve(h, up, as(client, key)).Code }) }
	send("greedy", "a")
	send("greedy", "b")
	send("greedy", "c")
	send("modest", "d")
	testutil.Eventually(t, 5*time.Second, "the four first requests to run", func() bool { return up.Calls.Load() == 4 })
	send("greedy", "a")
	send("greedy", "b")
	testutil.Eventually(t, 5*time.Second, "two of the greedy client's retries to wait", func() bool { n, _ := h.waiters.waiting(); return n == 2 })
	if w := serve(h, up, as("greedy", "c")); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("the greedy client's third waiting retry: %d %v, want 409 at once", w.Code, w.Header())
	}
	send("modest", "d")
	testutil.Eventually(t, 5*time.Second, "the other client's retry to wait", func() bool { n, _ := h.waiters.waiting(); return n == 3 })
	release()
	endWaiting(t, h, &wg, codes)
}

// TestWaitingBodiesStayWithinTheirBudget: a retry whose body would take
// the bytes that waiting requests hold past knobs.MaxWaitingBytes gets 409 at
// once; the first waiter waits whatever its size.
func TestWaitingBodiesStayWithinTheirBudget(t *testing.T) {
	defer knobs.MaxWaitingBytes.Store(knobs.MaxWaitingBytes.Load())
	knobs.MaxWaitingBytes.Store(100 << 10)
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release := heldUpstream()
	defer release()
	big := `{"pad":"` + strings.Repeat("p", 200<<10) + `"}`
	first := make(chan int, 1)
	go func() { first <- serve(h, up, request("k", big)).Code }()
	testutil.Eventually(t, 5*time.Second, "the first request to run", func() bool { return up.Calls.Load() == 1 })
	waiter := make(chan int, 1)
	go func() { waiter <- serve(h, up, request("k", big)).Code }()
	testutil.Eventually(t, 5*time.Second, "a retry with a body over the budget to wait alone", func() bool { n, _ := h.waiters.waiting(); return n == 1 })
	if _, bytes := h.waiters.waiting(); bytes < int64(len(big)) {
		t.Fatalf("the waiter holds %d bytes counted, want at least its body's %d", bytes, len(big))
	}
	if w := serve(h, up, request("k", big)); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a second retry past the budget: %d %v, want 409 at once", w.Code, w.Header())
	}
	release()
	if code := <-first; code != http.StatusCreated {
		t.Fatalf("first: %d", code)
	}
	if code := <-waiter; code != http.StatusCreated {
		t.Fatalf("the waiter within the budget got %d, want the replayed 201", code)
	}
	if n, bytes := h.waiters.waiting(); n != 0 || bytes != 0 {
		t.Fatalf("%d waiters and %d bytes left counted", n, bytes)
	}
}

// TestOneKeysWaitersTakeOnlyAQuarterOfTheBytes: past a quarter of
// knobs.MaxWaitingBytes, a retry of that key gets 409 at once, while a retry
// of another key still waits within the rest.
func TestOneKeysWaitersTakeOnlyAQuarterOfTheBytes(t *testing.T) {
	defer knobs.MaxWaitingBytes.Store(knobs.MaxWaitingBytes.Load())
	knobs.MaxWaitingBytes.Store(400 << 10) // a key's share: 100 KiB
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release := heldUpstream()
	defer release()
	body := `{"pad":"` + strings.Repeat("p", 60<<10) + `"}`
	var wg sync.WaitGroup
	codes := make(chan int, 4)
	// The other key is another client's: a client's waiters take a
	// quarter of the bytes too (TestOneClientsWaitersTakeOnlyItsShareOfThePlaces).
	send := func(key, body string) {
		wg.Go(func() {
			r := request(key, body)
			r.Header.Set("Authorization", "Bearer "+key)
			codes <- serve(h, up, r).Code
		})
	}
	send("storm", body)
	send("other", "{}")
	testutil.Eventually(t, 5*time.Second, "both first requests to run", func() bool { return up.Calls.Load() == 2 })
	send("storm", body)
	testutil.Eventually(t, 5*time.Second, "a retry of the storm's key to wait", func() bool { n, _ := h.waiters.waiting(); return n == 1 })
	storm := request("storm", body)
	storm.Header.Set("Authorization", "Bearer storm")
	if w := serve(h, up, storm); w.Code != http.StatusConflict {
		t.Fatalf("a second retry of the storm's key, past its share of the bytes: %d, want 409 at once", w.Code)
	}
	send("other", "{}")
	testutil.Eventually(t, 5*time.Second, "the other key's retry to wait", func() bool { n, _ := h.waiters.waiting(); return n == 2 })
	release()
	endWaiting(t, h, &wg, codes)
}

// endWaiting waits for the requests of a waiting test, once released: each
// first request and waiting retry must have got 201, and no place or byte
// may be left counted.
func endWaiting(t *testing.T, h *Handler, wg *sync.WaitGroup, codes chan int) {
	t.Helper()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusCreated {
			t.Errorf("a first request or a waiting retry got %d, want 201", code)
		}
	}
	if n, bytes := h.waiters.waiting(); n != 0 || bytes != 0 {
		t.Fatalf("%d waiters and %d bytes left counted", n, bytes)
	}
}

func TestWaitersBeyondTheCapGet409AtOnce(t *testing.T) {
	defer knobs.MaxWaiters.Store(knobs.MaxWaiters.Load())
	knobs.MaxWaiters.Store(1)
	h := isolated(t, &Handler{InFlight: "wait"})
	up, release, done := holdInFlight(h, request("k", "{}"))
	waiter := make(chan int)
	go func() { waiter <- serve(h, up, request("k", "{}")).Code }()
	testutil.Eventually(t, 5*time.Second, "the first waiter to wait", func() bool { n, _ := h.waiters.waiting(); return n == 1 })
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a waiter past the cap: %d %v, want 409 at once", w.Code, w.Header())
	}
	release()
	<-done
	if code := <-waiter; code != http.StatusCreated {
		t.Fatalf("the waiter within the cap got %d, want the replayed 201", code)
	}
	if n, bytes := h.waiters.waiting(); n != 0 || bytes != 0 {
		t.Fatalf("%d waiters and %d bytes left counted", n, bytes)
	}
}

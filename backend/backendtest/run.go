package backendtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// Run runs the handler scenarios every storage backend must pass on
// kind, each a subtest on a namespace of its own, through the real
// handler: one run per key under concurrent requests, replays,
// 422 and 409, a 5xx that frees the key, an unknown outcome that keeps
// it, the lease of a long request; on a Shared kind also two Caddy
// instances on one namespace, and a replay cache that outlives the
// record. The built-in backends run it from the handler's tests; a
// third party's backend runs it from its own (import the handler for
// its registration):
//
//	func TestScenarios(t *testing.T) {
//		backendtest.Run(t, backendtest.Kind{Name: "mystore", Open: openMyStore})
//	}
func Run(t *testing.T, kind Kind) {
	t.Helper()
	for _, s := range scenarios {
		if s.shared && !kind.Shared {
			continue
		}
		t.Run(s.name, func(t *testing.T) { s.run(t, kind, kind.Open(t)) })
	}
}

// A scenario is one subtest of Run; shared ones need a Shared kind.
type scenario struct {
	name   string
	shared bool
	run    func(t *testing.T, kind Kind, ns *Namespace)
}

var scenarios = []scenario{
	{name: "ConcurrentSameKeyRunsOnce", run: concurrentSameKeyRunsOnce},
	{name: "ReplayIsIdentical", run: replayIsIdentical},
	{name: "ConflictWhileInFlight", run: conflictWhileInFlight},
	{name: "WaitModeAllGetTheResponse", run: waitModeAllGetTheResponse},
	{name: "WaitModeTimesOutWithConflict", run: waitModeTimesOutWithConflict},
	{name: "A5xxFreesTheKey", run: a5xxFreesTheKey},
	{name: "LongRequestKeepsItsLease", run: longRequestKeepsItsLease},
	{name: "DistinctKeysRunConcurrently", run: distinctKeysRunConcurrently},
	{name: "AnUnknownOutcomeKeepsTheKey", run: anUnknownOutcomeKeepsTheKey},
	{name: "TwoInstancesShareKeys", shared: true, run: twoInstancesShareKeys},
	{name: "WaitAcrossInstances", shared: true, run: waitAcrossInstances},
	{name: "ReplayCacheServesReplaysWithoutTheStore", shared: true, run: replayCacheServesReplaysWithoutTheStore},
}

// handlerOn provisions a handler on the namespace with options.
func handlerOn(t *testing.T, ns *Namespace, options string) caddyhttp.MiddlewareHandler {
	t.Helper()
	return Handler(t, ns.Config(t, 0, options, ""))
}

// concurrentSameKeyRunsOnce fires 100 requests with one key at once: the
// upstream must run exactly once, one client gets its response and every
// other one a 409 (with Retry-After) or an identical replay.
func concurrentSameKeyRunsOnce(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, "")
	up := SlowUpstream(100 * time.Millisecond)
	responses := Fire(h, up, 100, "order-1", `{"amount":10}`)

	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times for 100 concurrent requests, want exactly 1", n)
	}
	var created, conflicts, replays int
	for _, r := range responses {
		switch {
		case r.Code == http.StatusConflict:
			conflicts++
			if r.Header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		case r.Code == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
			replays++
			if !bytes.Equal(r.Body, []byte(`{"id":"ord_1"}`)) {
				t.Errorf("replay body %q", r.Body)
			}
		case r.Code == http.StatusCreated:
			created++
		default:
			t.Errorf("unexpected response %d %q", r.Code, r.Body)
		}
	}
	if created != 1 || conflicts+replays != 99 {
		t.Fatalf("created %d, conflicts %d, replays %d; want 1 created and 99 others", created, conflicts, replays)
	}
}

// replayIsIdentical records a response with every byte value in its
// body and headers a store must keep exactly (multi-valued, empty): the
// retry replays status, the whole header map and the body, marked as a
// replay, without running the upstream again; another body gets 422.
func replayIsIdentical(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, "")
	body := make([]byte, 0, 1024)
	for i := range 1024 {
		body = append(body, byte(i))
	}
	sent := http.Header{
		"Content-Type": {"application/octet-stream"},
		"Set-Cookie":   {"a=1; Path=/", "b=2"},
		"Location":     {"/orders/42"},
		"X-Empty":      {""},
	}
	up := &Upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		maps.Copy(w.Header(), sent)
		w.WriteHeader(http.StatusAccepted)
		_, err := w.Write(body)
		return err
	}}

	first := Serve(h, up, Request("k", `{"a":1}`))
	if first.Code != http.StatusAccepted || !bytes.Equal(first.Body.Bytes(), body) {
		t.Fatalf("first: %d with %d bytes, want the upstream's 202 with %d", first.Code, first.Body.Len(), len(body))
	}
	if !maps.EqualFunc(first.Header(), sent, slices.Equal) {
		t.Fatalf("first response headers %v, want the upstream's %v", first.Header(), sent)
	}

	retry := Serve(h, up, Request("k", `{"a":1}`))
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
	if retry.Code != first.Code || !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) {
		t.Fatalf("replay %d with %d bytes, first %d with %d bytes", retry.Code, retry.Body.Len(), first.Code, first.Body.Len())
	}
	if got := retry.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("Idempotent-Replayed = %q, want true", got)
	}
	got := retry.Header().Clone()
	got.Del("Idempotent-Replayed")
	if !maps.EqualFunc(got, first.Header(), slices.Equal) {
		t.Fatalf("replay headers %v, first %v", got, first.Header())
	}
	if w := Serve(h, up, Request("k", `{"a":2}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d, want 422", w.Code)
	}
}

// conflictWhileInFlight: with in_flight reject, a retry while the first
// request runs gets 409 with Retry-After at once, and does not run.
func conflictWhileInFlight(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"in_flight":"reject"`)
	up, release, done := HoldInFlight(h, Request("k", `{"amount":10}`))
	if w := Serve(h, up, Request("k", `{"amount":10}`)); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a retry in flight: %d %v, want 409 with Retry-After", w.Code, w.Header())
	}
	release()
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

// waitModeAllGetTheResponse: as many requests with one key at once as a
// handler keeps waiting for one key, and the first: all get the first's
// answer.
func waitModeAllGetTheResponse(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"in_flight":"wait","wait_timeout":"10s"`)
	up := SlowUpstream(200 * time.Millisecond)
	n := 1 + int(knobs.MaxWaitersPerKey.Load())
	responses := Fire(h, up, n, "order-1", `{"amount":10}`)

	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want exactly 1", n)
	}
	replays := 0
	for _, r := range responses {
		if r.Code != http.StatusCreated || !bytes.Equal(r.Body, []byte(`{"id":"ord_1"}`)) {
			t.Fatalf("wait mode: got %d %q, want every request to get the 201", r.Code, r.Body)
		}
		if r.Header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != n-1 {
		t.Fatalf("%d replays, want %d", replays, n-1)
	}
}

func waitModeTimesOutWithConflict(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"in_flight":"wait","wait_timeout":"100ms"`)
	up := SlowUpstream(time.Second)
	first := make(chan struct{})
	go func() { Serve(h, up, Request("k", "{}")); close(first) }()
	defer func() { <-first }()
	testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.Calls.Load() == 1 })
	began := time.Now()
	w := Serve(h, up, Request("k", "{}"))
	if w.Code != http.StatusConflict {
		t.Fatalf("after wait_timeout: %d, want 409", w.Code)
	}
	if waited := time.Since(began); waited < 100*time.Millisecond {
		t.Fatalf("returned after %v, before wait_timeout", waited)
	}
}

// a5xxFreesTheKey: the first request's 503 frees the key, and the request
// waiting on it runs itself instead of getting a replay.
func a5xxFreesTheKey(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"in_flight":"wait"`)
	var mu sync.Mutex
	fail := true
	up := &Upstream{}
	up.Serve = func(w http.ResponseWriter, r *http.Request) error {
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
	go func() { first <- Serve(h, up, Request("k", "{}")).Code }()
	testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.Calls.Load() == 1 })
	second := Serve(h, up, Request("k", "{}"))
	if code := <-first; code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", code)
	}
	if second.Code != http.StatusCreated || second.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("waiter after a released key: %d replayed=%q; want it to run itself", second.Code, second.Header().Get("Idempotent-Replayed"))
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
	}
}

// longRequestKeepsItsLease: the upstream takes 3x lock_timeout; without
// renewal a retry would take the key over and run it a second time.
func longRequestKeepsItsLease(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"lock_timeout":"1s","in_flight":"reject"`)
	up := SlowUpstream(3 * time.Second)
	done := make(chan struct{})
	go func() { Serve(h, up, Request("k", "{}")); close(done) }()
	testutil.Eventually(t, 2*time.Second, "the first request to start", func() bool { return up.Calls.Load() == 1 })
	for range 6 {
		time.Sleep(400 * time.Millisecond)
		select {
		case <-done:
		default:
			if w := Serve(h, up, Request("k", "{}")); w.Code != http.StatusConflict {
				t.Fatalf("retry during the long request: %d, want 409", w.Code)
			}
		}
	}
	<-done
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("upstream ran %d times, want 1", n)
	}
}

func distinctKeysRunConcurrently(t *testing.T, _ Kind, ns *Namespace) {
	h := handlerOn(t, ns, "")
	up := SlowUpstream(50 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			key := "key-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
			if w := Serve(h, up, Request(key, "{}")); w.Code != http.StatusCreated {
				t.Errorf("%s: %d", key, w.Code)
			}
		})
	}
	wg.Wait()
	if up.Calls.Load() != 50 {
		t.Fatalf("upstream ran %d times, want 50", up.Calls.Load())
	}
}

// timeoutError is what reverse_proxy's response_header_timeout fails
// with: a net.Error that timed out.
type timeoutError struct{}

func (timeoutError) Error() string   { return "net/http: timeout awaiting response headers" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// problem is the part of a problem+json answer the scenarios read.
type problem struct {
	Type      string   `json:"type"`
	Status    int      `json:"status"`
	Retryable bool     `json:"retryable"`
	Differs   []string `json:"differs"`
}

// outcomeUnknown is the type of the outcome-unknown problem.
const outcomeUnknown = "urn:caddy-idempotency:outcome-unknown"

// problemIn decodes the problem answer w holds.
func problemIn(t *testing.T, code int, header http.Header, body []byte) problem {
	t.Helper()
	var p problem
	if ct := header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%d %q: Content-Type %q, want a problem", code, body, ct)
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Status != code {
		t.Fatalf("problem %q (status %d): %v", body, code, err)
	}
	return p
}

// anUnknownOutcomeKeepsTheKey: the key of a request that failed before
// any status after it may have reached the upstream is kept as an
// outcome-unknown record until ttl. Its retries (on another instance too)
// get the outcome-unknown problem and never run; another body gets 422
// first; the admin API's release frees the key, which then runs.
func anUnknownOutcomeKeepsTheKey(t *testing.T, kind Kind, ns *Namespace) {
	h := handlerOn(t, ns, `"in_flight":"wait"`)
	started, proceed := make(chan struct{}), make(chan struct{})
	up := &Upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		close(started)
		<-proceed
		// What reverse_proxy returns for response_header_timeout.
		return caddyhttp.Error(http.StatusGatewayTimeout, timeoutError{})
	}}
	first := make(chan int)
	repl := caddy.NewReplacer()
	go func() {
		w := httptest.NewRecorder()
		_ = ServeTo(h, up, w, Request("k", `{"amount":10}`), repl)
		first <- w.Code
	}()
	<-started
	// A retry sent while the first runs: it waits, or comes after.
	retried := make(chan *Snapshot, 1)
	go func() {
		w := Serve(h, up, Request("k", `{"amount":10}`))
		retried <- &Snapshot{Code: w.Code, Header: w.Header(), Body: w.Body.Bytes()}
	}()
	close(proceed)
	if code := <-first; code != http.StatusGatewayTimeout {
		t.Fatalf("first: %d, want the proxy's 504", code)
	}
	if r := <-retried; problemIn(t, r.Code, r.Header, r.Body).Type != outcomeUnknown || r.Code != http.StatusBadGateway {
		t.Fatalf("the retry sent while it ran got %d %q, want the outcome-unknown 502", r.Code, r.Body)
	}
	up.Serve = nil
	handlers := []caddyhttp.MiddlewareHandler{h}
	if kind.Shared {
		handlers = append(handlers, Handler(t, ns.Config(t, 1, "", "")))
	}
	for _, hh := range handlers {
		w := Serve(hh, up, Request("k", `{"amount":10}`))
		if p := problemIn(t, w.Code, w.Header(), w.Body.Bytes()); w.Code != http.StatusBadGateway || p.Type != outcomeUnknown || p.Retryable {
			t.Fatalf("retry: %d %+v, want the outcome-unknown problem", w.Code, p)
		}
		w = Serve(hh, up, Request("k", `{"amount":11}`))
		if p := problemIn(t, w.Code, w.Header(), w.Body.Bytes()); w.Code != http.StatusUnprocessableEntity || len(p.Differs) == 0 {
			t.Fatalf("another body: %d %+v, want 422 naming what differs", w.Code, p)
		}
	}
	if n := up.Calls.Load(); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
	kh, _ := repl.GetString("http.idempotency.key_hash")
	if code, body := adminCall(t, http.MethodDelete, "/idempotency/outcome_unknown?key_hash="+kh); code != http.StatusOK {
		t.Fatalf("release of key_hash %q: %d %s", kh, code, body)
	}
	if w := Serve(h, up, Request("k", `{"amount":10}`)); w.Code != http.StatusCreated || up.Calls.Load() != 2 {
		t.Fatalf("after the release: %d, %d runs; want it run", w.Code, up.Calls.Load())
	}
}

// adminCall calls the idempotency admin API, found by its module ID as
// Caddy's admin endpoint finds it.
func adminCall(t *testing.T, method, path string) (int, string) {
	t.Helper()
	info, err := caddy.GetModule("admin.api.idempotency")
	if err != nil {
		t.Fatal(err)
	}
	var handler caddy.AdminHandler
	for _, route := range info.New().(caddy.AdminRouter).Routes() {
		if strings.HasPrefix(path, route.Pattern) {
			handler = route.Handler
		}
	}
	if handler == nil {
		t.Fatalf("no admin route for %s", path)
	}
	w := httptest.NewRecorder()
	if err := handler.ServeHTTP(w, httptest.NewRequest(method, path, nil)); err != nil {
		var apiErr caddy.APIError
		if errors.As(err, &apiErr) {
			return apiErr.HTTPStatus, err.Error()
		}
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	return w.Code, w.Body.String()
}

// twoInstances provisions handlers on the namespace as two Caddy
// instances would be: same records, a client or pool each.
func twoInstances(t *testing.T, ns *Namespace, options string) (x, y caddyhttp.MiddlewareHandler) {
	t.Helper()
	c1, c2 := ns.Config(t, 1, options, ""), ns.Config(t, 2, options, "")
	if reflect.DeepEqual(c1, c2) {
		t.Fatal("the two instances' storage configs are the same, so they would share a store; want a client or pool each")
	}
	return Handler(t, c1), Handler(t, c2)
}

func twoInstancesShareKeys(t *testing.T, _ Kind, ns *Namespace) {
	x, y := twoInstances(t, ns, "")
	up := SlowUpstream(200 * time.Millisecond)
	responses := Alternate(x, y, up, 40, "shared-key", `{"x":1}`)
	if c := up.Calls.Load(); c != 1 {
		t.Fatalf("upstream ran %d times across two instances, want 1", c)
	}
	created := 0
	for i, r := range responses {
		switch {
		case r.Code == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
			created++
		case r.Code == http.StatusCreated, r.Code == http.StatusConflict:
		default:
			t.Errorf("request %d: %d", i, r.Code)
		}
	}
	if created != 1 {
		t.Fatalf("%d requests got the upstream's response fresh, want 1", created)
	}
	// Either instance replays what the other recorded.
	for _, h := range []caddyhttp.MiddlewareHandler{x, y} {
		if w := Serve(h, up, Request("shared-key", `{"x":1}`)); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("no replay after the race: %d", w.Code)
		}
	}
}

func waitAcrossInstances(t *testing.T, _ Kind, ns *Namespace) {
	x, y := twoInstances(t, ns, `"in_flight":"wait","wait_timeout":"10s"`)
	up := SlowUpstream(300 * time.Millisecond)
	const n = 50
	began := time.Now()
	responses := Alternate(x, y, up, n, "waited-key", `{"x":1}`)
	took := time.Since(began)
	if c := up.Calls.Load(); c != 1 {
		t.Fatalf("upstream ran %d times, want 1", c)
	}
	replays := 0
	for i, r := range responses {
		if r.Code != http.StatusCreated || string(r.Body) != `{"id":"ord_1"}` {
			t.Fatalf("request %d: %d %q, want every waiter to get the 201", i, r.Code, r.Body)
		}
		if r.Header.Get("Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != n-1 {
		t.Fatalf("%d replays, want %d", replays, n-1)
	}
	// Notified or polled with a backoff capped at 250ms: never at the
	// handler's 1s wait granularity.
	if took > 2*time.Second {
		t.Errorf("waiters took %v for a 300ms request", took)
	}
}

// replayCacheServesReplaysWithoutTheStore: a cached replay needs no
// store; it survives the record vanishing from the store (Forget) until
// the cache entry's ttl ends, and still tells another request with the
// key apart.
func replayCacheServesReplaysWithoutTheStore(t *testing.T, _ Kind, ns *Namespace) {
	if ns.Forget == nil {
		t.Skip("the namespace cannot forget its records")
	}
	// The cache's ttl is long next to any stall of a busy machine between
	// caching the record and the checks that it is served.
	const ttl = 2 * time.Second
	h := Handler(t, ns.Config(t, 0, "", `"replay_cache":{"max_entries":100,"ttl":"2s"}`))
	up := &Upstream{}
	Serve(h, up, Request("cached", "{}"))
	if w := Serve(h, up, Request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay")
	}
	cached := time.Now() // the entry was made before: it ends before cached+ttl
	ns.Forget(t)         // the record is gone from the store
	if w := Serve(h, up, Request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != `{"order":42}` {
		t.Fatalf("cached replay after the record left the store: %d %q", w.Code, w.Body.String())
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.Calls.Load())
	}
	if w := Serve(h, up, Request("cached", `{"other":1}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("other request against the cached record: %d, want 422", w.Code)
	}
	time.Sleep(time.Until(cached.Add(ttl + 200*time.Millisecond))) // past the cache ttl
	if w := Serve(h, up, Request("cached", "{}")); w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatal("replayed from the cache after its ttl")
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.Calls.Load())
	}
}

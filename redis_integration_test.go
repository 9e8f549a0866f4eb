package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-idempotency/caddy-idempotency/internal/redistest"
)

// These tests run the handler on the Redis store: the shared server
// (redistest.Addr, under a key prefix of each test's own) or, to count
// commands, a private one.

// redisPrefix returns a key prefix no other test or run uses.
func redisPrefix() string {
	return "idempotency-test:" + redistest.RandomHex(6) + ":"
}

// onRedis provisions h on the Redis at addr under prefix; extra adds
// fields to the storage object (`,"pool_size":3`).
func onRedis(t *testing.T, h *Handler, addr, prefix, extra string) *Handler {
	t.Helper()
	h.StorageRaw = json.RawMessage(fmt.Sprintf(`{"backend":"redis","url":"redis://%s/0","key_prefix":%q%s}`, addr, prefix, extra))
	return provision(t, h)
}

// sharedRedis returns the shared Redis's address, skipping the test (or
// failing it under CI=true) when it does not answer.
func sharedRedis(t *testing.T) string {
	t.Helper()
	addr := redistest.Addr()
	redistest.Require(t, addr)
	return addr
}

func TestRedisConcurrentSameKeyRunsOnce(t *testing.T) {
	assertConcurrentSameKeyRunsOnce(t, onRedis(t, &Handler{}, sharedRedis(t), redisPrefix(), ""))
}

func TestRedisReplayIsIdentical(t *testing.T) {
	h := onRedis(t, &Handler{}, sharedRedis(t), redisPrefix(), "")
	up := &upstream{}
	first := serve(h, up, request("k", `{"a":1}`))
	again := serve(h, up, request("k", `{"a":1}`))
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
	if again.Code != first.Code || again.Body.String() != first.Body.String() ||
		again.Header().Get("X-Order") != "42" || again.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("replay %d %q %v, first %d %q", again.Code, again.Body, again.Header(), first.Code, first.Body)
	}
	if again.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay not marked")
	}
	if w := serve(h, up, request("k", `{"a":2}`)); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("other body, same key: %d, want 422", w.Code)
	}
}

func TestRedisCompletedKeyExpires(t *testing.T) {
	h := onRedis(t, &Handler{TTL: caddy.Duration(time.Second)}, sharedRedis(t), redisPrefix(), "")
	up := &upstream{}
	serve(h, up, request("k", "{}"))
	if w := serve(h, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay within the TTL")
	}
	time.Sleep(1300 * time.Millisecond)
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the TTL: %d replayed=%q, want a fresh run", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if up.calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
	}
}

// twoInstances returns two handlers sharing one Redis under one prefix
// but with their own clients (a different pool_size is a different
// configuration), as two Caddy instances would be.
func twoInstances(t *testing.T, h1, h2 *Handler) (*Handler, *Handler) {
	t.Helper()
	addr, prefix := sharedRedis(t), redisPrefix()
	a := onRedis(t, h1, addr, prefix, `,"pool_size":11`)
	b := onRedis(t, h2, addr, prefix, `,"pool_size":12`)
	if a.store == b.store {
		t.Fatal("the two instances share a store; want a client each")
	}
	return a, b
}

func TestRedisTwoInstancesShareKeys(t *testing.T) {
	a, b := twoInstances(t, &Handler{}, &Handler{})
	up := slowUpstream(100 * time.Millisecond)
	const n = 40
	var wg sync.WaitGroup
	start := make(chan struct{})
	codes := make([]int, n)
	for i := range n {
		h := a
		if i%2 == 1 {
			h = b
		}
		wg.Go(func() {
			<-start
			codes[i] = serve(h, up, request("shared-key", `{"x":1}`)).Code
		})
	}
	close(start)
	wg.Wait()
	if c := up.calls.Load(); c != 1 {
		t.Fatalf("upstream ran %d times across two instances, want 1", c)
	}
	for i, code := range codes {
		if code != http.StatusCreated && code != http.StatusConflict {
			t.Errorf("request %d: %d", i, code)
		}
	}
	// Either instance replays what the other recorded.
	for _, h := range []*Handler{a, b} {
		if w := serve(h, up, request("shared-key", `{"x":1}`)); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("no replay after the race: %d", w.Code)
		}
	}
}

func TestRedisWaitAcrossInstances(t *testing.T) {
	wait := func() *Handler { return &Handler{InFlight: "wait", WaitTimeout: caddy.Duration(10 * time.Second)} }
	a, b := twoInstances(t, wait(), wait())
	up := slowUpstream(300 * time.Millisecond)
	const n = 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	type result struct {
		code     int
		body     string
		replayed bool
	}
	results := make([]result, n)
	began := time.Now()
	for i := range n {
		h := a
		if i%2 == 1 {
			h = b
		}
		wg.Go(func() {
			<-start
			w := serve(h, up, request("waited-key", `{"x":1}`))
			results[i] = result{w.Code, w.Body.String(), w.Header().Get("Idempotent-Replayed") == "true"}
		})
	}
	close(start)
	wg.Wait()
	took := time.Since(began)
	if c := up.calls.Load(); c != 1 {
		t.Fatalf("upstream ran %d times, want 1", c)
	}
	replays := 0
	for i, r := range results {
		if r.code != http.StatusCreated || r.body != `{"id":"ord_1"}` {
			t.Fatalf("request %d: %d %q, want every waiter to get the 201", i, r.code, r.body)
		}
		if r.replayed {
			replays++
		}
	}
	if replays != n-1 {
		t.Fatalf("%d replays, want %d", replays, n-1)
	}
	// Notified, not polled at the handler's 1s granularity.
	if took > 2*time.Second {
		t.Errorf("waiters took %v for a 300ms request", took)
	}
}

func TestRedisDownAtProvision(t *testing.T) {
	// Nothing listens on port 1: Provision must still succeed (a Redis
	// outage must not block a Caddy start or reload).
	for _, policy := range []string{failClosed, failOpen} {
		t.Run(policy, func(t *testing.T) {
			h := &Handler{OnStorageError: policy}
			h.StorageRaw = json.RawMessage(`{"backend":"redis","url":"redis://127.0.0.1:1/0","timeout":"500ms","key_prefix":"` + redisPrefix() + `"}`)
			provision(t, h)
			up := &upstream{}
			began := time.Now()
			w := serve(h, up, request("k", "{}"))
			took := time.Since(began)
			switch policy {
			case failClosed:
				if w.Code != http.StatusServiceUnavailable || up.calls.Load() != 0 {
					t.Fatalf("fail_closed: %d, upstream ran %d times; want 503 and 0", w.Code, up.calls.Load())
				}
				problemOf(t, w)
			case failOpen:
				if w.Code != http.StatusCreated || up.calls.Load() != 1 {
					t.Fatalf("fail_open: %d, upstream ran %d times; want 201 and 1", w.Code, up.calls.Load())
				}
			}
			if took > 2*time.Second {
				t.Errorf("answered after %v; timeout is 500ms", took)
			}
		})
	}
}

// TestRedisRoundTripsThroughHandler counts, on a private server, what one
// request costs in Redis commands: a new key two, a replay one.
func TestRedisRoundTripsThroughHandler(t *testing.T) {
	srv := redistest.StartServer(t)
	h := onRedis(t, &Handler{}, srv.Addr, redisPrefix(), "")
	mon := redistest.NewMonitor(t, srv.Addr)
	up := &upstream{}

	// Warm up: connection handshake, and the NOSCRIPT/EVAL of each script
	// on a fresh server.
	serve(h, up, request("warm-up", "{}"))
	serve(h, up, request("warm-up", "{}"))

	for _, step := range []struct {
		name     string
		want     int
		replayed string
	}{
		{"new key", 2, ""},
		{"replay", 1, "true"},
	} {
		var w *httptest.ResponseRecorder
		before := mon.CommandStats()
		cmds := mon.Commands(func() { w = serve(h, up, request("counted", `{"n":1}`)) })
		after := mon.CommandStats()
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != step.replayed {
			t.Fatalf("%s: %d replayed=%q", step.name, w.Code, w.Header().Get("Idempotent-Replayed"))
		}
		var names []string
		for _, c := range cmds {
			names = append(names, c.Name+"["+strings.Join(c.Script, " ")+"]")
		}
		if len(cmds) != step.want {
			t.Errorf("%s: %d Redis commands (%s), want %d", step.name, len(cmds), strings.Join(names, ", "), step.want)
		}
		if d := after["evalsha"] - before["evalsha"]; d != step.want {
			t.Errorf("%s: commandstats evalsha +%d, want +%d", step.name, d, step.want)
		}
		t.Logf("%s: %d round trip(s): %s", step.name, len(cmds), strings.Join(names, ", "))
	}
}

// TestRedisCaddyfileEndToEnd runs a real Caddy from a Caddyfile with a
// redis storage block in front of a reverse-proxied upstream.
func TestRedisCaddyfileEndToEnd(t *testing.T) {
	addr := sharedRedis(t)
	up := newCountingUpstream(t)
	up.delay = 100 * time.Millisecond
	base := loadCaddyfile(t, freePort(t), fmt.Sprintf(`
	idempotency {
		storage redis redis://%s/0 {
			key_prefix %s
			timeout 2s
		}
	}
	reverse_proxy %s`, addr, redisPrefix(), up.Listener.Addr().String()))

	var wg sync.WaitGroup
	var created, others atomic.Int64
	start := make(chan struct{})
	for range 40 {
		wg.Go(func() {
			<-start
			resp, _ := post(t, base+"/orders", "order-e2e", `{"amount":10}`)
			switch {
			case resp.StatusCode == http.StatusCreated && resp.Header.Get("Idempotent-Replayed") == "":
				created.Add(1)
			case resp.StatusCode == http.StatusCreated, resp.StatusCode == http.StatusConflict:
				others.Add(1)
			default:
				t.Errorf("unexpected %d", resp.StatusCode)
			}
		})
	}
	close(start)
	wg.Wait()
	if c := up.calls.Load(); c != 1 || created.Load() != 1 {
		t.Fatalf("upstream ran %d times, %d fresh responses; want 1 and 1", c, created.Load())
	}
	resp, body := post(t, base+"/orders", "order-e2e", `{"amount":10}`)
	if resp.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(body), "ord_1") {
		t.Fatalf("replay: %d %q", resp.StatusCode, body)
	}
}

// TestRedisSentinelFromConfig configures the handler for a Sentinel-managed
// primary whose Sentinel requires a password given as an {env.*}
// placeholder: the handler runs, replays and isolates requests there, and
// with the wrong Sentinel password it fails closed without running.
func TestRedisSentinelFromConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a Sentinel")
	}
	sentinel := redistest.StartSentinel(t, "s3ntinel-pass")
	t.Setenv("IDEM_TEST_SENTINEL_PASSWORD", sentinel.Password)
	storage := func(password string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"backend":"redis","addresses":[%q],"master_name":%q,"sentinel_password":%q,"key_prefix":%q,"timeout":"1s"}`,
			sentinel.Addr, sentinel.MasterName, password, redisPrefix()))
	}

	h := provision(t, &Handler{StorageRaw: storage("{env.IDEM_TEST_SENTINEL_PASSWORD}")})
	up := &upstream{}
	first := serve(h, up, request("k", `{"a":1}`))
	again := serve(h, up, request("k", `{"a":1}`))
	if first.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("first %d, retry %d replayed=%q", first.Code, again.Code, again.Header().Get("Idempotent-Replayed"))
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}

	wrong := provision(t, &Handler{StorageRaw: storage("not-the-password")})
	if w := serve(wrong, up, request("other", `{}`)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("wrong Sentinel password: %d, want 503 (fail_closed)", w.Code)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

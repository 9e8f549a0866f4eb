package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// What one client can make Caddy hold: memory for bodies it only
// announces, and keys in the memory store.

// rss is the resident set size of process pid, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the process status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in the process status")
	return 0
}

// requestsInFlight is Caddy's caddy_http_requests_in_flight, summed over
// its series (the `metrics` global option must be on).
func requestsInFlight(t *testing.T, inst *caddyproc.Instance) int {
	t.Helper()
	status, body := adminGet(t, inst, "/metrics")
	if status != 200 {
		t.Fatalf("admin /metrics: %d", status)
	}
	n := 0.0
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, "caddy_http_requests_in_flight{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += v
	}
	return int(n)
}

// Requests that announce a 1 MiB body (within max_body_size) and send
// none must not make Caddy reserve that memory up front: 200 such
// connections are a cheap attack otherwise (200 MiB).
func TestAnnouncedBodiesThatNeverComeDoNotHoldMemory(t *testing.T) {
	const conns, declared, bound = 200, 1 << 20, 30 << 20
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{globals: "metrics", routes: route(up, "storage memory")})
	if r := post(inst.URL(), "/orders", "warm", `{"amount":10}`); !r.isNew() {
		t.Fatalf("warm-up request: %s", describe(r))
	}
	inFlight := func() int { return requestsInFlight(t, inst) }
	if n := inFlight(); n != 0 {
		t.Fatalf("%d requests in flight before the test", n)
	}
	before := rss(t, inst.PID())

	open := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := range conns {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", inst.Port), 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		open = append(open, c)
		head := fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
			"Idempotency-Key: announced-%d\r\nContent-Length: %d\r\n\r\n", i, declared)
		if _, err := c.Write([]byte(head)); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	// Every request has reached the handlers and waits for its body.
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("%d requests in flight", conns), func() bool { return inFlight() >= conns })
	peak := before
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		peak = max(peak, rss(t, inst.PID()))
	}
	grown := peak - before
	t.Logf("RSS %d MiB before, %d MiB at most with %d requests waiting for %d-byte bodies", before>>20, peak>>20, conns, declared)
	if grown >= bound {
		t.Fatalf("RSS grew by %d MiB while %d requests announced %d-byte bodies and sent none, want less than %d MiB", grown>>20, conns, declared, bound>>20)
	}
	assertExecutions(t, up, "announced-0", 0)

	for _, c := range open {
		c.Close()
	}
	open = nil
	testutil.Eventually(t, 10*time.Second, "the requests to end", func() bool { return inFlight() == 0 })
	if r := post(inst.URL(), "/orders", "after", `{"amount":10}`); !r.isNew() {
		t.Fatalf("a request afterwards: %s", describe(r))
	}
}

// max_keys_per_scope is one client's (one scope's) share of the memory
// store once it holds half of max_keys: past it, a new key is refused
// with 429; the client's keys still replay, and other clients are not
// affected.
func TestMemoryStoreBoundsKeysPerClient(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "storage memory {\n\tmax_keys 10\n\tmax_keys_per_scope 5\n}")})
	u := inst.URL()
	one := []string{"Authorization", "Bearer one"}
	two := []string{"Authorization", "Bearer two"}

	for i := 1; i <= 5; i++ {
		if r := post(u, "/orders", fmt.Sprintf("one-%d", i), `{"amount":10}`, one...); !r.isNew() {
			t.Fatalf("client one, key %d of 5: %s", i, describe(r))
		}
	}
	r := post(u, "/orders", "one-6", `{"amount":10}`, one...)
	assertExecutions(t, up, "one-6", 0)
	if r.status != 429 || r.problem() != "urn:caddy-idempotency:too-many-keys" {
		t.Fatalf("client one, a sixth key: %s, want 429 urn:caddy-idempotency:too-many-keys", describe(r))
	}
	if r := post(u, "/orders", "one-1", `{"amount":10}`, one...); !r.isReplayOf(1) {
		t.Fatalf("client one, a key it holds: %s, want a replay", describe(r))
	}
	if r := post(u, "/orders", "two-1", `{"amount":10}`, two...); !r.isNew() {
		t.Fatalf("client two: %s, want it to run", describe(r))
	}
}

package e2e

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// What one client can make Caddy hold: memory for bodies it only
// announces, and keys in the memory store.

// rss is the resident set size of process pid, in bytes.
func rss(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmRSS") }

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

// procStatus is a field of /proc/<pid>/status in bytes (VmRSS, VmHWM).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the process status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in the process status", field)
	return 0
}

// bytesRead is how many bytes process pid has read, sockets included
// (rchar of /proc/<pid>/io).
func bytesRead(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		t.Fatalf("reading the process's I/O counts: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("rchar %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("no rchar in the process's I/O counts")
	return 0
}

// One client's retry storm must not take every other client's places in
// the wait, nor the instance's memory: a thousand retries of one key in
// flight, all at once, while another client's retry of its own key in
// flight waits. That client's retry waits and gets its replay, not 409
// at once (the storm's key has a share of the places of its own); the
// storm's retries that find no place, or no room under the bytes that
// waiting requests may hold, get 409 at once and let their bodies go:
// with bodies of 1 MiB, Caddy's resident memory grows by a fraction of
// the gigabyte the storm sends; and each key runs once (an instance the
// storm starved let a lease lapse, and a waiting retry took the key over).
func TestAWaiterStormTakesNeitherOtherClientsPlacesNorTheMemory(t *testing.T) {
	const storm = 1000
	needFiles(t, 2*storm+200)
	for _, sc := range []struct {
		name     string
		bodySize int
	}{{"small-bodies", 0}, {"1MiB-bodies", 1 << 20}} {
		body := `{"amount":10}`
		if sc.bodySize > 0 {
			body = fmt.Sprintf(`{"amount":10,"pad":"%s"}`, strings.Repeat("p", sc.bodySize-len(`{"amount":10,"pad":""}`)))
		}
		for _, b := range allBackends {
			t.Run(sc.name+"/"+b.name, func(t *testing.T) {
				store := b.open(t)
				up := newHoldingUpstream(t)
				inst := startCaddy(t, "caddy", site{globals: "metrics", routes: fmt.Sprintf(
					"\tidempotency {\n%s\nlock_timeout 2s\nwait_timeout 60s\n\t}\n\treverse_proxy %s\n", store.storage, up.Addr)})
				res := waiterStorm(t, inst, up, storm, body)
				t.Logf("the storm's retries: %v; the other client's retry got %s, %s after the storm; RSS %d MiB before, %d MiB at its peak",
					res.outcomes, describe(res.retry), res.retryAfter.Round(time.Millisecond), res.before>>20, res.peak>>20)
				if !res.retry.isReplayOf(1) {
					t.Errorf("another client's retry during the storm got %s, want to wait and get its replay", describe(res.retry))
				}
				if grown := res.peak - res.before; sc.bodySize > 0 && grown > waitingBodiesBound {
					t.Errorf("RSS grew by %d MiB during a storm of %d retries with %d-byte bodies, want at most %d MiB", grown>>20, storm, sc.bodySize, waitingBodiesBound>>20)
				}
				if n := up.executions("storm"); n != 1 {
					t.Errorf("the storm's key ran %d times, want once", n)
				}
				if n := up.executions("victim"); n != 1 {
					t.Errorf("the other client's key ran %d times, want once", n)
				}
				if len(res.outcomes) > 2 || res.outcomes["409"]+res.outcomes["replayed"] != storm {
					t.Errorf("the storm's retries got %v, want their replay or 409", res.outcomes)
				}
			})
		}
	}
}

// waitingBodiesBound is what a storm of waiting retries may add to
// Caddy's resident memory: the bytes that waiting requests may hold (64
// MiB a handler), as much again for the garbage collector's room, and
// the bodies being read at any one moment.
const waitingBodiesBound = 256 << 20

// stormUploads is how many of a storm's retries have sent their bodies
// and not had them read by Caddy, at most: they may all wait together,
// but reach Caddy as a thousand clients retrying one after another do,
// rather than as one upload of a gigabyte (the bodies being read take
// their size in memory, whatever the module does with them then).
const stormUploads = 16

// stormResult is what a waiter storm did.
type stormResult struct {
	outcomes     map[string]int // the storm's answers, by kind
	retry        reply          // the other client's retry
	retryAfter   time.Duration  // from the storm's bodies read to that retry's answer
	before, peak int64          // Caddy's resident memory before the storm, and its peak
}

// waiterStorm runs one key's first request and another client's, both
// held at up until the test releases them; then n retries of the first
// key with body, all at once, each on a connection of its own; once
// Caddy has read every one of them, the other client's retry; then it
// releases the first requests.
func waiterStorm(t *testing.T, inst *caddyproc.Instance, up *holdingUpstream, n int, body string) stormResult {
	t.Helper()
	u := inst.URL()
	victim := []string{"Authorization", "Bearer victim"}
	if r := post(u, "/orders", "warm", `{"amount":10}`); r.status != 201 {
		t.Fatalf("warm-up request: %s", describe(r))
	}
	res := stormResult{outcomes: map[string]int{}, before: rss(t, inst.PID())}
	readBefore := bytesRead(t, inst.PID())
	firsts := make(chan reply, 2)
	go func() { firsts <- post(u, "/orders", "storm", body, holdHeader, "1") }()
	go func() { firsts <- post(u, "/orders", "victim", `{"amount":10}`, append(victim, holdHeader, "1")...) }()
	defer func() {
		up.release()
		<-firsts
		<-firsts
	}()
	testutil.Eventually(t, 30*time.Second, "both first requests to run", func() bool {
		return up.executions("storm") == 1 && up.executions("victim") == 1
	})

	stormed := make([]reply, n)
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range n {
		// At most stormUploads bodies sent and not yet read by Caddy.
		testutil.Eventually(t, 2*time.Minute, "Caddy to read the storm's bodies", func() bool {
			return bytesRead(t, inst.PID())-readBefore >= int64((i-stormUploads)*len(body))
		})
		wg.Go(func() {
			stormed[i] = post(u, "/orders", "storm", body)
			answered.Add(1)
		})
	}
	// Every retry has reached Caddy (it is in flight there, or answered),
	// and Caddy has read every body.
	testutil.Eventually(t, 2*time.Minute, "Caddy to read the storm", func() bool {
		return bytesRead(t, inst.PID())-readBefore >= int64(n*len(body)) && int64(requestsInFlight(t, inst))+answered.Load() >= int64(n+2)
	})
	sent := time.Now()
	retried := make(chan reply, 1)
	go func() { retried <- post(u, "/orders", "victim", `{"amount":10}`, victim...) }()
	// Answered at once, it found no place; else it waits, and the first
	// requests end.
	select {
	case res.retry = <-retried:
	case <-time.After(2 * time.Second):
	}
	up.release()
	if res.retry.status == 0 && res.retry.err == nil {
		res.retry = <-retried
	}
	res.retryAfter = time.Since(sent)
	wg.Wait()
	res.peak = procStatus(t, inst.PID(), "VmHWM")
	for _, r := range stormed {
		switch {
		case r.isReplayOf(1):
			res.outcomes["replayed"]++
		case r.isConflict():
			res.outcomes["409"]++
		default:
			res.outcomes[describe(r)]++
		}
	}
	return res
}

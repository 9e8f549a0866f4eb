package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// Failure paths after the upstream has answered: the effect happened
// once, so the key is never freed again (docs/guarantees.md). An
// upstream that breaks off mid-body, and a client that hangs up, leave a
// record of the status and headers; every retry replays it and the
// upstream never runs twice.

// breakAfter makes the upstream send status, headers and n body bytes of
// a larger declared Content-Length, then drop the connection: Caddy's
// reverse_proxy aborts the response with http.ErrAbortHandler.
func breakAfter(n int, status int) []string {
	return []string{"X-Upstream-Break-After", strconv.Itoa(n), "X-Upstream-Status", strconv.Itoa(status)}
}

// brokenOff fails unless the client of the request that ran got status
// and then a broken body: the failure the test is about did happen.
func brokenOff(t *testing.T, r reply, status int) {
	t.Helper()
	if r.status != status || r.err == nil {
		t.Fatalf("request whose upstream broke off: %s, want %d and then a broken body", describe(r), status)
	}
}

func TestUpstreamBreakingOffMidBodyIsRecordedAndNeverRunsAgain(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage)})
			for _, status := range []int{200, 201} {
				key := fmt.Sprintf("broken-off-%d", status)
				header := breakAfter(1000, status)
				brokenOff(t, post(inst.URL(), "/orders", key, `{"amount":10}`, header...), status)
				assertExecutions(t, up, key, 1)

				// The same request again, as a client retries it.
				for i := range 3 {
					r := retryPast409(inst, key, `{"amount":10}`, 2*time.Second, header...)
					assertExecutions(t, up, key, 1)
					omittedReplay(t, fmt.Sprintf("retry %d", i+1), r, status)
				}
			}
		})
	}
}

// With in_flight wait, retries sent while the first request runs wait for
// it; when its upstream breaks off they all get its record, and nobody
// runs the upstream again.
func TestUpstreamBreakingOffMidBodyIsReplayedToWaitingRetries(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+"\nin_flight wait")})
			const key = "broken-off-waited"
			header := append(breakAfter(1000, 201), delay(time.Second)...)

			first := make(chan reply, 1)
			go func() { first <- post(inst.URL(), "/orders", key, `{"amount":10}`, header...) }()
			testutil.Eventually(t, 10*time.Second, "the upstream to start running", func() bool { return up.Executions(key) == 1 })
			retries := make(chan reply, 5)
			for range 5 {
				go func() { retries <- post(inst.URL(), "/orders", key, `{"amount":10}`, header...) }()
			}
			brokenOff(t, <-first, 201)
			got := make([]reply, 5)
			for i := range got {
				got[i] = <-retries
			}
			assertExecutions(t, up, key, 1)
			for i, r := range got {
				omittedReplay(t, fmt.Sprintf("waiting retry %d", i+1), r, 201)
			}
		})
	}
}

// sized makes the upstream stream n bytes of caddyproc.Pattern in chunks,
// pausing pause after each.
func sized(n int, pause time.Duration) []string {
	return []string{"X-Upstream-Size", strconv.Itoa(n), "X-Upstream-Chunk-Delay", strconv.Itoa(int(pause.Milliseconds()))}
}

// hangUp sends a keyed POST with header on a connection of its own, reads
// the status and the first n body bytes, and closes the connection while
// the rest is still coming. It returns the status.
func hangUp(t *testing.T, inst *caddyproc.Instance, key string, n int, header ...string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", inst.Port), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	var req bytes.Buffer
	const body = `{"amount":10}`
	fmt.Fprintf(&req, "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n", key, len(body))
	for i := 0; i+1 < len(header); i += 2 {
		fmt.Fprintf(&req, "%s: %s\r\n", header[i], header[i+1])
	}
	req.WriteString("\r\n" + body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the request the client hangs up on: %v", err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, n)); err != nil {
		t.Fatalf("reading the first %d bytes before hanging up: %v", n, err)
	}
	return resp.StatusCode
}

// slowBody is a response of 200 KiB that the upstream takes about half a
// second to send: a client hanging up after its first bytes leaves most
// of it unsent.
const slowBody = 200 << 10

var slowly = sized(slowBody, 20*time.Millisecond)

// A client that hangs up during a response larger than max_response_size
// changes nothing: Caddy reads the upstream's answer to the end and keeps
// its status and headers; the retry is a replay without body, never a
// second execution and never a 409.
func TestClientHangingUpDuringAnOversizeResponseLeavesARecord(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage+"\nmax_response_size 1KiB")})
			const key = "hang-up-oversize"

			if status := hangUp(t, inst, key, 16<<10, slowly...); status != 201 {
				t.Fatalf("status before hanging up: %d, want 201", status)
			}
			testutil.Eventually(t, 20*time.Second, "the upstream to finish its answer", func() bool { return up.Finished(key) == 1 })

			r := retryPast409(inst, key, `{"amount":10}`, 2*time.Second, slowly...)
			assertExecutions(t, up, key, 1)
			if r.isConflict() {
				t.Fatalf("retry after the upstream finished: still 409 after 2s: %s", describe(r))
			}
			omittedReplay(t, "retry after the client hung up", r, 201)
			if up.Delivered(key) != 1 {
				t.Fatal("the upstream's answer was not read to the end after the client hung up")
			}
		})
	}
}

// Within max_response_size, the whole body is recorded even though the
// client that asked never read it, and the retry gets it byte for byte.
func TestClientHangingUpDuringAResponseWithinTheLimitLeavesTheWholeBody(t *testing.T) {
	for _, b := range allBackends {
		t.Run(b.name, func(t *testing.T) {
			store := b.open(t)
			up := newUpstream(t)
			inst := startCaddy(t, "caddy", site{routes: route(up, store.storage)})
			const key = "hang-up-within-limit"

			if status := hangUp(t, inst, key, 16<<10, slowly...); status != 201 {
				t.Fatalf("status before hanging up: %d, want 201", status)
			}
			testutil.Eventually(t, 20*time.Second, "the upstream to finish its answer", func() bool { return up.Finished(key) == 1 })

			r := retryPast409(inst, key, `{"amount":10}`, 2*time.Second, slowly...)
			assertExecutions(t, up, key, 1)
			if r.err != nil || r.status != 201 || !r.replayed() || r.header.Get("Idempotent-Body-Omitted") != "" ||
				r.header.Get("X-Key-Execution") != "1" || !bytes.Equal(r.body, caddyproc.Pattern(slowBody)) {
				t.Fatalf("retry after the client hung up: %s, want a replay of execution 1 with its whole %d-byte body", describe(r), slowBody)
			}
			if up.Delivered(key) != 1 {
				t.Fatal("the upstream's answer was not read to the end after the client hung up")
			}
		})
	}
}

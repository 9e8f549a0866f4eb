package e2e

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// A client is gone only after 10 s without taking a byte of its answer
// (docs: "judged on progress"), never because one write of the answer
// took long: a client reading steadily at 1 KB/s, on a mobile link or
// through a slow proxy, keeps its response.
//
// The answer is 64 KiB, sent by the upstream as fast as it can with its
// Content-Length, so that Caddy hands it on in writes of up to 32 KiB; the
// client takes 1 KiB a second and lets the server run only a few tens of
// kilobytes ahead (a small TCP receive buffer, small HTTP/2 and HTTP/3
// flow control windows; TestHarnessSlowClientsHoldTheServerBack). Over
// HTTP/2 and HTTP/3 one write then waits about half a minute for the
// client, which takes a byte every second all the while. (Over HTTP/1.1
// the server's own TCP send buffer grows as the client reads, on Linux,
// and takes in most of such an answer: there the test holds the promise
// without pressing it as hard.)

// slowRate is the pace of the slow readers, in bytes a second.
const slowRate = 1 << 10

func TestSlowReadersGetTheWholeResponse(t *testing.T) {
	t.Parallel() // slow by nature: it runs beside the other slow-client tests
	const size = 64 << 10
	want := caddyproc.Pattern(size)
	up := newUpstream(t)

	// One Caddy per protocol; the slow readers read side by side (a
	// minute each), whatever -parallel says.
	type slowRead struct {
		srv    *protoSite
		key    string
		status int
		end    readEnd
	}
	reads := make([]*slowRead, len(allProtocols))
	var wg sync.WaitGroup
	for i, p := range allProtocols {
		r := &slowRead{srv: startOver(t, p, "slow-"+p.name, route(up, "")), key: "slow-reader-" + p.name}
		reads[i] = r
		c := r.srv.client(t, true)
		wg.Go(func() {
			resp, err := r.srv.request(c, r.key, sized(size, 0)...)
			if err != nil {
				r.end.err = err
				return
			}
			defer resp.Body.Close()
			r.status, r.end = resp.StatusCode, readPaced(resp.Body, slowRate)
		})
	}
	wg.Wait()

	for _, r := range reads {
		t.Run(r.srv.proto.name, func(t *testing.T) {
			r.srv.logOnFailure(t)
			t.Logf("the slow client got %d and %s", r.status, r.end)
			if r.status != 201 || !r.end.whole(want) {
				t.Errorf("a client reading %d bytes a second got %d and %s (the bytes agree up to %d), want 201 and all %d bytes, then a clean end of stream",
					slowRate, r.status, r.end, firstDifference(r.end.got, want), size)
			}

			// Whatever it got, the answer was recorded whole, and the
			// upstream ran once.
			again := r.srv.post(t, r.key, sized(size, 0)...)
			if again.err != nil || again.status != 201 || !again.replayed() || !bytes.Equal(again.body, want) {
				t.Errorf("retry: %d, replayed %v, %d bytes, %v; want the whole answer replayed", again.status, again.replayed(), len(again.body), again.err)
			}
			assertExecutions(t, up, r.key, 1)
		})
	}
}

// A silent upstream is not a stalled client: an answer that pauses for
// longer than the stall timeout (an SSE stream, an LLM, a long
// computation once the headers are out) reaches a client that reads it
// as it comes whole, over every protocol. The stall timeout judges the
// client's progress while a write to it is pending, never the time
// between two writes of the upstream.
//
// The upstream is silent for a minute: once its status and headers are
// sent and flushed (an answer without Content-Length, which Caddy hands
// on as it comes), or once the first 8 KiB of a sized answer are. Over
// HTTP/3 the client sends keep-alives, as browsers do (Chromium every
// 15 s while a stream is open): Caddy's QUIC connections close after 30 s
// without a packet, whatever the module does.

// silentFor is how long the upstream sends nothing: six times the stall
// timeout.
const silentFor = 60 * time.Second

func TestASilentUpstreamReachesTheClientWhole(t *testing.T) {
	t.Parallel() // slow by nature: it runs beside the other slow-client tests
	const size = 64 << 10
	want := caddyproc.Pattern(size)
	silence := fmt.Sprintf(":%d", silentFor.Milliseconds())
	up := newUpstream(t)
	type silentRead struct {
		srv    *protoSite
		key    string
		how    string
		body   []string
		status int
		end    readEnd
	}
	var reads []*silentRead
	var wg sync.WaitGroup
	for _, p := range allProtocols {
		srv := startOver(t, p, "silent-"+p.name, route(up, ""))
		for _, c := range []struct{ how, at string }{{"headers", "0"}, {"first-bytes", "8192"}} {
			r := &silentRead{srv: srv, key: "silent-" + c.how + "-" + p.name, how: c.how}
			r.body = append(sized(size, 0), "X-Upstream-Silence", c.at+silence)
			if c.how == "headers" {
				r.body = append(r.body, "X-Upstream-Unsized", "true")
			}
			reads = append(reads, r)
			cl := srv.client(t, false)
			wg.Go(func() {
				resp, err := srv.request(cl, r.key, r.body...)
				if err != nil {
					r.end.err = err
					return
				}
				defer resp.Body.Close()
				r.status, r.end = resp.StatusCode, readRest(resp.Body, nil)
			})
		}
	}
	wg.Wait()

	for _, r := range reads {
		t.Run(r.srv.proto.name+"/"+r.how, func(t *testing.T) {
			r.srv.logOnFailure(t)
			t.Logf("after an upstream silent for %s after its %s, the client got %d and %s", silentFor, r.how, r.status, r.end)
			if r.status != 201 || !r.end.whole(want) {
				t.Errorf("an upstream silent for %s after its %s: the client got %d and %s (the bytes agree up to %d), want 201 and all %d bytes, then a clean end of stream",
					silentFor, r.how, r.status, r.end, firstDifference(r.end.got, want), size)
			}
			if r.end.whole(want) && r.end.took < silentFor-time.Second {
				t.Errorf("the answer took %s: the upstream was not silent for %s", r.end.took, silentFor)
			}
			again := r.srv.post(t, r.key, r.body...)
			if again.err != nil || again.status != 201 || !again.replayed() || !bytes.Equal(again.body, want) {
				t.Errorf("retry: %d, replayed %v, %d bytes, %v; want the whole answer replayed", again.status, again.replayed(), len(again.body), again.err)
			}
			assertExecutions(t, up, r.key, 1)
		})
	}
}

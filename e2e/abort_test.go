package e2e

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// A client that stops reading is let go: its key is freed once it has
// taken nothing for 10 s, so that a retry from another connection gets
// the recorded answer instead of 409 for as long as the stalled
// connection lives. And what the stalled client gets of its answer, once
// it reads again, is never mistaken for the whole: a response cut short
// is aborted (HTTP/1.1: the connection closed without the last chunk;
// HTTP/2: RST_STREAM; HTTP/3: the stream reset), never ended cleanly.
// The answer has no Content-Length, so the end of the stream is all a
// client has to tell a whole answer from a part.

// stallFor is how long the stalled client reads nothing: well past the
// 10 s after which it counts as gone.
const stallFor = 25 * time.Second

func TestAStalledClientFreesItsKeyAndItsCutShortAnswerNeverEndsCleanly(t *testing.T) {
	t.Parallel() // slow by nature: it runs beside the other slow-client tests
	const size = 900_000
	want := caddyproc.Pattern(size)
	up := newUpstream(t)
	type stalled struct {
		name  string
		proto protocol
		slow  bool     // a slow client's small buffers (see protoSite.client); else the library's defaults
		body  []string // how the upstream sends the answer
	}
	cases := []stalled{
		{"h1", overH1, true, unsizedBody(size)},
		{"h2", overH2, true, unsizedBody(size)},
		{"h2c", overH2C, true, unsizedBody(size)},
		{"h3", overH3, true, unsizedBody(size)},
		// quic-go's default windows (512 KiB for a stream) and the
		// upstream's Content-Length, which quic-go does not check: an
		// HTTP/3 client as it comes.
		{"h3-default-windows", overH3, false, sized(size, 0)},
	}

	// One Caddy per case; the stalls run side by side, whatever -parallel
	// says.
	type stall struct {
		stalled
		srv     *protoSite
		key     string
		status  int
		err     error         // the stalling client's request failed
		retry   reply         // the first retry that was not a 409
		retries int           // how many retries it took
		freedIn time.Duration // from the stall's start to that retry's answer
		end     readEnd       // what the stalled client got once it read on
	}
	stalls := make([]*stall, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		s := &stall{stalled: c, srv: startOver(t, c.proto, "stall-"+c.name, route(up, "")), key: "stalled-" + c.name}
		stalls[i] = s
		client, other := s.srv.client(t, c.slow), s.srv.client(t, false)
		wg.Go(func() {
			resp, err := s.srv.request(client, s.key, c.body...)
			if err != nil {
				s.err = err
				return
			}
			defer resp.Body.Close()
			s.status = resp.StatusCode
			stalledAt := time.Now()

			// It reads nothing more. Retries from another connection get
			// 409 until it counts as gone, then the replay (90 s: a
			// safety bound).
			for bound := stalledAt.Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				s.retries++
				s.retry = s.srv.postWith(other, s.key, c.body...)
				s.freedIn = time.Since(stalledAt)
				if s.retry.err != nil || !s.retry.isConflict() {
					break
				}
				if time.Now().After(bound) {
					s.retry.err = errors.New("still 409 after 90 s")
					break
				}
			}

			// Once it has read nothing for stallFor, it reads on.
			time.Sleep(time.Until(stalledAt.Add(stallFor)))
			s.end = readRest(resp.Body, nil)
		})
	}
	wg.Wait()

	for _, s := range stalls {
		t.Run(s.name, func(t *testing.T) {
			s.srv.logOnFailure(t)
			if s.err != nil || s.status != 201 {
				t.Fatalf("the stalling client got %d, %v; want the upstream's 201", s.status, s.err)
			}
			t.Logf("a retry was answered %s after the stall began (retry %d): %d, replayed %v, %d bytes, %v",
				s.freedIn.Round(100*time.Millisecond), s.retries, s.retry.status, s.retry.replayed(), len(s.retry.body), s.retry.err)
			t.Logf("the stalled client read on after %s and got %s", stallFor, s.end)

			// The stalled client was let go: a retry got the whole
			// answer replayed, and the upstream ran once.
			if s.retry.err != nil || s.retry.status != 201 || !s.retry.replayed() || !bytes.Equal(s.retry.body, want) {
				t.Errorf("retry while the first client stalled: %d, replayed %v, %d bytes, %v; want the whole answer replayed",
					s.retry.status, s.retry.replayed(), len(s.retry.body), s.retry.err)
			}
			assertExecutions(t, up, s.key, 1)

			// It got the whole answer, or an error; never a clean end of
			// stream after a part.
			if s.end.err == nil && !bytes.Equal(s.end.got, want) {
				t.Errorf("the stalled client's answer ended cleanly after %d bytes (agreeing up to %d) of %d: a response cut short must be aborted, never ended cleanly",
					len(s.end.got), firstDifference(s.end.got, want), size)
			}
			if s.end.err != nil && !bytes.Equal(s.end.got, want[:min(len(s.end.got), size)]) {
				t.Errorf("the stalled client got %d bytes that differ from the answer at %d", len(s.end.got), firstDifference(s.end.got, want))
			}
		})
	}
}

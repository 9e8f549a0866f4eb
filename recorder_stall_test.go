package idempotency

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// TestAClientThatStopsReadingDoesNotHoldItsKey: a client that reads the
// status of a large answer and then nothing more counts as gone after
// knobs.StallTimeout; the answer is read to its end and recorded, and
// retries from other connections get it replayed (not 409 for as long as
// the stalled connection lives).
func TestAClientThatStopsReadingDoesNotHoldItsKey(t *testing.T) {
	defer knobs.ClientStallTimeout.Store(knobs.ClientStallTimeout.Load())
	knobs.ClientStallTimeout.Store(int64(200 * time.Millisecond))
	h := isolated(t, &Handler{})
	big := strings.Repeat("x", 32<<20) // more than any socket buffers
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(big))
		return err
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serveTo(h, up, w, r) }))
	defer srv.Close()

	stalled, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	fmt.Fprintf(stalled, "POST /orders HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: stall\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", srv.Listener.Addr())
	if _, err := http.ReadResponse(bufio.NewReader(stalled), nil); err != nil {
		t.Fatal(err)
	}
	// It reads nothing more. Retries from another connection meet the
	// key in flight until the stalled client counts as gone, then get the
	// replay; the stalled connection stays open all along.
	var last *http.Response
	testutil.Eventually(t, 30*time.Second, "a retry to be replayed while the first client stalls", func() bool {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "stall")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		last = resp
		return resp.StatusCode != http.StatusConflict
	})
	if last.StatusCode != http.StatusCreated || last.Header.Get("Idempotent-Replayed") != "true" || last.Header.Get(bodyOmittedHeader) != "true" {
		t.Fatalf("retry: %d %v, want the replayed 201 (body too large to keep)", last.StatusCode, last.Header)
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("the upstream ran %d times, want once", up.Calls.Load())
	}
}

// TestASilentUpstreamIsNotAStalledClient: an answer whose upstream sends
// nothing for several stall timeouts, once its headers are flushed or
// once its first bytes are written, reaches a client that reads it as it
// comes whole, over HTTP/1.1, HTTP/2 and h2c: the client is judged only while a
// write to it is pending. (Over HTTP/2 a write deadline armed by the last
// write reset the stream of a healthy client.)
func TestASilentUpstreamIsNotAStalledClient(t *testing.T) {
	defer knobs.ClientStallTimeout.Store(knobs.ClientStallTimeout.Load())
	stall := 200 * time.Millisecond
	knobs.ClientStallTimeout.Store(int64(stall))
	silence := 5 * stall
	body := strings.Repeat("s", 20<<10)
	for _, proto := range []string{"h1", "h2", "h2c"} {
		for _, after := range []int{0, 6 << 10} {
			t.Run(fmt.Sprintf("%s/silent-after-%d-bytes", proto, after), func(t *testing.T) {
				h := isolated(t, &Handler{})
				up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
					rc := http.NewResponseController(w)
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusCreated)
					// The headers flushed (an SSE stream), or the first bytes
					// written (a proxy copying a sized answer).
					if after == 0 {
						if err := rc.Flush(); err != nil {
							return err
						}
					} else if _, err := io.WriteString(w, body[:after]); err != nil {
						return err
					}
					time.Sleep(silence)
					_, err := io.WriteString(w, body[after:])
					return err
				}}
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serveTo(h, up, w, r) }))
				srv.Config.Protocols = new(http.Protocols)
				srv.Config.Protocols.SetHTTP1(true)
				client := &http.Client{Transport: &http.Transport{Protocols: new(http.Protocols)}}
				tr := client.Transport.(*http.Transport)
				switch proto {
				case "h1":
					srv.Start()
					tr.Protocols.SetHTTP1(true)
				case "h2c":
					srv.Config.Protocols.SetUnencryptedHTTP2(true)
					srv.Start()
					tr.Protocols.SetUnencryptedHTTP2(true)
				case "h2":
					srv.Config.Protocols.SetHTTP2(true)
					srv.EnableHTTP2 = true
					srv.StartTLS()
					client = srv.Client()
				}
				defer srv.Close()
				defer client.CloseIdleConnections()

				post := func() (*http.Response, []byte, error) {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", "silent")
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						return nil, nil, err
					}
					defer resp.Body.Close()
					got, err := io.ReadAll(resp.Body)
					return resp, got, err
				}
				resp, got, err := post()
				if err != nil && resp == nil {
					t.Fatal(err)
				}
				if want := map[string]int{"h1": 1, "h2": 2, "h2c": 2}[proto]; resp.ProtoMajor != want {
					t.Fatalf("the answer came over %s, want HTTP/%d", resp.Proto, want)
				}
				if err != nil || resp.StatusCode != http.StatusCreated || string(got) != body {
					t.Fatalf("an upstream silent for %s after %d bytes: %d, %d of %d bytes, %v; want 201 and the whole answer", silence, after, resp.StatusCode, len(got), len(body), err)
				}
				again, got, err := post()
				if err != nil || again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || string(got) != body {
					t.Fatalf("retry: %v, %d bytes, %v; want the whole answer replayed", again, len(got), err)
				}
				if n := up.Calls.Load(); n != 1 {
					t.Fatalf("the upstream ran %d times, want once", n)
				}
			})
		}
	}
}

// TestAClientThatStopsReadingOverHTTP2DoesNotHoldItsKey is
// TestAClientThatStopsReadingDoesNotHoldItsKey over h2c, with a client
// whose flow-control windows are small: the stall watch cuts off the
// pending write of a client that takes nothing (its stream is reset), and
// retries get the replay. The writer is wrapped as Caddy's server wraps
// it (its write idle timeout, caddyhttp.IdleTimeoutWriter, whose
// deadline is no business of another goroutine's: under -race, a cut
// through it is a data race).
func TestAClientThatStopsReadingOverHTTP2DoesNotHoldItsKey(t *testing.T) {
	defer knobs.ClientStallTimeout.Store(knobs.ClientStallTimeout.Load())
	knobs.ClientStallTimeout.Store(int64(200 * time.Millisecond))
	h := isolated(t, &Handler{})
	big := strings.Repeat("x", 4<<20)
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, big)
		return err
	}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idle := &caddyhttp.IdleTimeoutWriter{
			ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
			Ctrl:                  http.NewResponseController(w),
			Deadline:              caddyhttp.IdleDeadline{Start: time.Now(), Timeout: time.Minute},
			Logger:                zap.NewNop(),
			ClearBetweenWrites:    r.ProtoMajor == 2,
		}
		defer idle.HandlerDone()
		serveTo(h, up, idle, r)
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	h2c := func(window int) *http.Client {
		tr := &http.Transport{Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{MaxReceiveBufferPerStream: window, MaxReceiveBufferPerConnection: 4 * window}}
		tr.Protocols.SetUnencryptedHTTP2(true)
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	post := func(c *http.Client) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "stall-h2")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	stalled := post(h2c(16 << 10))
	defer stalled.Body.Close()
	other := h2c(4 << 20)
	var last *http.Response
	testutil.Eventually(t, 30*time.Second, "a retry to be replayed while the first client stalls", func() bool {
		last = post(other)
		_, _ = io.Copy(io.Discard, last.Body)
		last.Body.Close()
		return last.StatusCode != http.StatusConflict
	})
	if last.StatusCode != http.StatusCreated || last.Header.Get("Idempotent-Replayed") != "true" || last.Header.Get(bodyOmittedHeader) != "true" {
		t.Fatalf("retry: %d %v, want the replayed 201 (body too large to keep)", last.StatusCode, last.Header)
	}
	// The stalled client's stream was reset: what it reads on ends in an
	// error, never cleanly.
	if got, err := io.ReadAll(stalled.Body); err == nil {
		t.Fatalf("the stalled client read on and got %d of %d bytes and a clean end", len(got), len(big))
	}
	if up.Calls.Load() != 1 {
		t.Fatalf("the upstream ran %d times, want once", up.Calls.Load())
	}
}

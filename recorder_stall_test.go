package idempotency

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
	up := &upstream{serve: func(w http.ResponseWriter, r *http.Request) error {
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
	if up.calls.Load() != 1 {
		t.Fatalf("the upstream ran %d times, want once", up.calls.Load())
	}
}

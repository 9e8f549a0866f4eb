package inprocess_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A handler that panics after it has sent its status has had its effect:
// the key is kept, and the retry replays the status without the body
// (docs/guarantees.md). Caddy's reverse_proxy does exactly that
// (panic(http.ErrAbortHandler)) when an upstream breaks off mid-body; so
// can any handler, with any value. A panic before any status leaves the
// outcome unknown: the key is kept, and every retry gets the
// outcome-unknown answer. This runs a whole Caddy config in this process, with a test-only
// handler after idempotency.

func init() {
	caddy.RegisterModule(panicAfterStatus{})
}

// panicAfterStatus is http.handlers.test_panic_after_status, a test-only
// handler driven by request headers:
//
//	X-Panic: abort (http.ErrAbortHandler, the default), boom (an error
//	         value) or none (no panic: answer 201 with a whole body)
//	X-Panic-When: after-status (the default: after 201 and a few body
//	         bytes, flushed) or before-status
//
// It counts its runs per Idempotency-Key in panicRuns.
type panicAfterStatus struct{}

// panicRuns counts the runs of panicAfterStatus per key.
var panicRuns sync.Map // string -> *atomic.Int64

func panicRunsOf(key string) *atomic.Int64 {
	v, _ := panicRuns.LoadOrStore(key, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// CaddyModule returns the Caddy module information.
func (panicAfterStatus) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.test_panic_after_status",
		New: func() caddy.Module { return new(panicAfterStatus) },
	}
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (panicAfterStatus) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	panicRunsOf(r.Header.Get("Idempotency-Key")).Add(1)
	var value any = http.ErrAbortHandler
	switch r.Header.Get("X-Panic") {
	case "boom":
		value = errors.New("boom")
	case "none":
		value = nil
	}
	if value != nil && r.Header.Get("X-Panic-When") == "before-status" {
		panic(value)
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	if value == nil {
		_, err := io.WriteString(w, "the whole body")
		return err
	}
	_, _ = io.WriteString(w, "partial")
	_ = http.NewResponseController(w).Flush()
	panic(value)
}

var _ caddyhttp.MiddlewareHandler = panicAfterStatus{}

// loadPanicServer runs a Caddy config in this process: idempotency (on a
// memory store of its own) in front of panicAfterStatus, on a free
// loopback port. It returns the base URL; the config is stopped when the
// test ends.
func loadPanicServer(t *testing.T) string {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf(`{
		"admin": {"disabled": true, "config": {"persist": false}},
		"logging": {"logs": {"default": {"level": "ERROR", "exclude": ["http.stdlib"]}}},
		"apps": {"http": {"servers": {"panic": {
			"listen": ["127.0.0.1:%d"],
			"automatic_https": {"disable": true},
			"routes": [{"handle": [
				{"handler": "idempotency", "storage": {"backend": "memory", "max_keys": %d}},
				{"handler": "test_panic_after_status"}
			]}]
		}}}}
	}`, port, uniqueMaxKeys())
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// panicPost sends a keyed POST with header pairs on a connection of its
// own (a panic closes the connection) and returns what came back, up to
// the error that broke it off, if any.
func panicPost(t *testing.T, base, key string, header ...string) (status int, h http.Header, body string, err error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"amount":10}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

func TestPanicAfterTheStatusKeepsTheKeyAndReplaysWithoutBody(t *testing.T) {
	base := loadPanicServer(t)
	for _, tt := range []struct{ name, panicWith string }{
		{"http.ErrAbortHandler", "abort"},
		{"an error value", "boom"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprintf("after-status-%s-%d", tt.panicWith, uniqueMaxKeys()) // a key of this run: panicRuns counts for the process
			status, _, body, err := panicPost(t, base, key, "X-Panic", tt.panicWith)
			if err == nil || (status != 0 && status != http.StatusCreated) {
				t.Fatalf("request whose handler panicked: %d %q, %v; want 201 or nothing, then a broken connection", status, body, err)
			}
			// The same request again, as a client retries it.
			for i := range 2 {
				status, h, body, err := panicPost(t, base, key, "X-Panic", tt.panicWith)
				if n := panicRunsOf(key).Load(); n != 1 {
					t.Fatalf("the handler ran %d times for key %q, want 1", n, key)
				}
				if err != nil || status != http.StatusCreated || h.Get("Idempotent-Body-Omitted") != "true" ||
					h.Get("Idempotent-Replayed") != "true" || body != "" {
					t.Fatalf("retry %d: %d Idempotent-Body-Omitted=%q Idempotent-Replayed=%q body %q, %v; want a replay of 201 with the body omitted",
						i+1, status, h.Get("Idempotent-Body-Omitted"), h.Get("Idempotent-Replayed"), body, err)
				}
			}
		})
	}
	t.Run("before the status", func(t *testing.T) {
		for _, panicWith := range []string{"abort", "boom"} {
			key := fmt.Sprintf("before-status-%s-%d", panicWith, uniqueMaxKeys())
			if status, _, body, err := panicPost(t, base, key, "X-Panic", panicWith, "X-Panic-When", "before-status"); err == nil {
				t.Fatalf("%s: request whose handler panicked before its status: %d %q, want a broken connection", panicWith, status, body)
			}
			// What the panicking code did is unknown: the key is kept.
			for i := range 2 {
				status, h, body, err := panicPost(t, base, key, "X-Panic", "none")
				if err != nil || status != http.StatusBadGateway || h.Get("Content-Type") != "application/problem+json" ||
					!strings.Contains(body, "urn:caddy-idempotency:outcome-unknown") {
					t.Fatalf("%s: retry %d: %d %q, %v; want the outcome-unknown 502", panicWith, i+1, status, body, err)
				}
			}
			if n := panicRunsOf(key).Load(); n != 1 {
				t.Fatalf("%s: the handler ran %d times for key %q, want 1", panicWith, n, key)
			}
		}
	})
}

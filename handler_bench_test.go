package idempotency

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// discardWriter is a ResponseWriter that keeps only the status, so that a
// benchmark can check it measured the answer it means to.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(status int)      { d.status = status }

// benchHandler is a handler on a memory store of its own that holds every
// key a benchmark makes (one client makes them all).
func benchHandler(b *testing.B) *Handler {
	h := &Handler{StorageRaw: json.RawMessage(`{"backend":"memory","max_keys":` + strconv.FormatInt(900_000_000+nextMaxKeys.Add(1), 10) + `,"max_keys_per_scope":100000000}`)}
	return provision(b, h)
}

// serveCreated serves r and fails b unless the answer is the upstream's
// 201 (new or replayed), not a rejection.
func serveCreated(b *testing.B, h *Handler, w *discardWriter, r *http.Request, next caddyhttp.Handler) {
	if err := h.ServeHTTP(w, r, next); err != nil {
		b.Fatal(err)
	}
	if w.status != http.StatusCreated {
		b.Fatalf("status %d, want 201", w.status)
	}
}

var benchBody = bytes.Repeat([]byte(`{"sku":"abc-123","qty":2},`), 40)

func benchJSON() []byte { return append(append([]byte(`{"items":[`), benchBody...), `{}]}`...) }

func nopNext() caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id":"ord_1","status":"created"}`))
		return err
	})
}

func TestPassThroughAllocatesNothing(t *testing.T) {
	h := isolated(t, &Handler{})
	w := &discardWriter{h: http.Header{}}
	r := caddyhttp.PrepareRequest(httptest.NewRequest(http.MethodGet, "/orders", nil), caddy.NewReplacer(), w, nil)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	if n := testing.AllocsPerRun(1000, func() { _ = h.ServeHTTP(w, r, next) }); n != 0 {
		t.Fatalf("a GET (not in methods) costs %v allocations, want 0", n)
	}
}

func BenchmarkPassThrough(b *testing.B) {
	h := isolated(b, &Handler{})
	w := &discardWriter{h: http.Header{}}
	r := caddyhttp.PrepareRequest(httptest.NewRequest(http.MethodGet, "/orders", nil), caddy.NewReplacer(), w, nil)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	b.ReportAllocs()
	for b.Loop() {
		_ = h.ServeHTTP(w, r, next)
	}
}

// benchRequest builds a prepared POST as Caddy's server would.
func benchRequest(key string, body []byte, w http.ResponseWriter) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://api.example.com/orders", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer sk_test_123")
	r.Header.Set("Idempotency-Key", key)
	return caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, nil)
}

func BenchmarkNewKey(b *testing.B) {
	h := benchHandler(b)
	body := benchJSON()
	next := nopNext()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	i := 0
	for b.Loop() {
		w := &discardWriter{h: http.Header{}}
		i++
		serveCreated(b, h, w, benchRequest("new-"+strconv.Itoa(i), body, w), next)
	}
}

func BenchmarkReplay(b *testing.B) {
	h := benchHandler(b)
	body := benchJSON()
	next := nopNext()
	w := &discardWriter{h: http.Header{}}
	serveCreated(b, h, w, benchRequest("replayed", body, w), next)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		w := &discardWriter{h: http.Header{}}
		serveCreated(b, h, w, benchRequest("replayed", body, w), next)
		if w.h.Get("Idempotent-Replayed") != "true" {
			b.Fatal("not a replay")
		}
	}
}

// BenchmarkRequestSetup is the cost of building a request in the
// benchmarks above, to subtract from them.
func BenchmarkRequestSetup(b *testing.B) {
	body := benchJSON()
	b.ReportAllocs()
	for b.Loop() {
		w := &discardWriter{h: http.Header{}}
		_ = benchRequest("replayed", body, w)
	}
}

package idempotency

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/klauspost/compress/zstd"

	"github.com/caddy-idempotency/caddy-idempotency/backend/backendtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
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

// SetWriteDeadline succeeds, as on Caddy's own writers (the recorder arms
// one against stalled clients): without it, the benchmarks would count
// the error http.ResponseController makes, which a server never pays.
func (d *discardWriter) SetWriteDeadline(time.Time) error { return nil }

// benchHandler is a handler on a memory store of its own that holds every
// key a benchmark makes (one client makes them all), configured further
// by opts.
func benchHandler(b testing.TB, opts ...func(*Handler)) *Handler {
	h := &Handler{StorageRaw: json.RawMessage(`{"backend":"memory","max_keys":` + strconv.FormatInt(900_000_000+nextMaxKeys.Add(1), 10) + `,"max_keys_per_scope":100000000}`)}
	for _, opt := range opts {
		opt(h)
	}
	return provision(b, h)
}

// newBenchWriter is the response writer of a benchmark's request.
func newBenchWriter() *discardWriter { return &discardWriter{h: http.Header{}} }

// storeBenchHandler is a handler on a store of the tests' shared Redis or
// PostgreSQL server (storage is its JSON config), for the benchmarks of
// the client side of a store: what a request costs over the memory store.
func storeBenchHandler(b *testing.B, storage map[string]any) *Handler {
	raw, err := json.Marshal(storage)
	if err != nil {
		b.Fatal(err)
	}
	return provision(b, &Handler{StorageRaw: raw})
}

// cpuPerOp reports, as cpu-ns/op, the CPU time the whole process used
// from now to the call of the function it returns (after the loop), per
// iteration: user and system time of every goroutine (a store client's
// own, garbage collection), and, unlike ns/op, the same on a machine other
// processes keep busy.
func cpuPerOp(b *testing.B) (report func()) {
	start := processCPU(b)
	return func() {
		b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
	w := newBenchWriter()
	r := caddyhttp.PrepareRequest(httptest.NewRequest(http.MethodGet, "/orders", nil), caddy.NewReplacer(), w, nil)
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	if n := testing.AllocsPerRun(1000, func() { _ = h.ServeHTTP(w, r, next) }); n != 0 {
		t.Fatalf("a GET (not in methods) costs %v allocations, want 0", n)
	}
}

func BenchmarkPassThrough(b *testing.B) {
	h := isolated(b, &Handler{})
	w := newBenchWriter()
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
	benchNewKeys(b, benchHandler(b), false)
}

// BenchmarkNewKeyNewBody is BenchmarkNewKey with a body of its own for
// every key (an amount changes), as new operations mostly have: no
// request's fingerprint is remembered from one before.
func BenchmarkNewKeyNewBody(b *testing.B) {
	benchNewKeys(b, benchHandler(b), true)
}

func BenchmarkReplay(b *testing.B) {
	benchReplays(b, benchHandler(b), false)
}

// BenchmarkRedisReplay is a replay from the tests' Redis: one round trip
// (the get script) over BenchmarkReplay.
func BenchmarkRedisReplay(b *testing.B) {
	benchReplays(b, redisBenchHandler(b), false)
}

// BenchmarkReplayParallel is BenchmarkReplay with 64 requests at once
// (on two cores), the baseline of BenchmarkRedisReplayParallel.
func BenchmarkReplayParallel(b *testing.B) {
	benchReplays(b, benchHandler(b), true)
}

// BenchmarkRedisReplayParallel is BenchmarkRedisReplay with 64 requests at
// once, as a loaded server sends them: concurrent replays share the
// pipeliner's round trips, so it measures the client's own cost per
// replay rather than a round trip's system calls, which one request at a
// time pays alone.
func BenchmarkRedisReplayParallel(b *testing.B) {
	benchReplays(b, redisBenchHandler(b), true)
}

// redisBenchHandler is a handler on the tests' Redis, under a key prefix
// of its own.
func redisBenchHandler(b *testing.B) *Handler {
	addr := redistest.Addr()
	redistest.Require(b, addr)
	prefix := backendtest.RedisPrefix()
	h := storeBenchHandler(b, map[string]any{"backend": "redis", "url": "redis://" + addr + "/0", "key_prefix": prefix})
	b.Cleanup(func() { backendtest.DeleteRedisPrefix(b, addr, prefix) })
	return h
}

// benchReplays replays one recorded key, one request at a time or from
// 64 goroutines (parallel).
func benchReplays(b *testing.B, h *Handler, parallel bool) {
	body := benchJSON()
	next := nopNext()
	w := newBenchWriter()
	serveCreated(b, h, w, benchRequest("replayed", body, w), next)
	replay := func() error {
		w := newBenchWriter()
		if err := h.ServeHTTP(w, benchRequest("replayed", body, w), next); err != nil || w.h.Get("Idempotent-Replayed") != "true" {
			return fmt.Errorf("not a replay: status %d, error %v", w.status, err)
		}
		return nil
	}
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.SetBytes(int64(len(body)))
	if !parallel {
		for b.Loop() {
			if err := replay(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := replay(); err != nil {
				b.Error(err) // not Fatal: this is not the benchmark's goroutine
				return
			}
		}
	})
}

// BenchmarkPostgresNewKey is a new key on the tests' PostgreSQL: two
// durable commits (the reservation and the record) around the next
// handler, one request at a time.
func BenchmarkPostgresNewKey(b *testing.B) {
	dsn := pgtest.Require(b)
	table := pgtest.Table(b, dsn)
	h := storeBenchHandler(b, map[string]any{"backend": "postgres", "dsn": dsn, "table": table, "max_conns": 8})
	benchNewKeys(b, h, false)
}

// BenchmarkPostgresNewKeyParallel is BenchmarkPostgresNewKey from 32
// goroutines at once, as make bench's 32 connections send them: the
// reservations and records share batches and commits, and cpu-ns/op is
// this process's CPU per new key (the handler, pgx, the batcher; not
// PostgreSQL's).
func BenchmarkPostgresNewKeyParallel(b *testing.B) {
	dsn := pgtest.Require(b)
	table := pgtest.Table(b, dsn)
	h := storeBenchHandler(b, map[string]any{"backend": "postgres", "dsn": dsn, "table": table, "max_conns": 8})
	body := benchJSON()
	next := nopNext()
	var n atomic.Int64
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.SetBytes(int64(len(body)))
	b.SetParallelism(16) // 32 on two cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := newBenchWriter()
			key := "new-" + strconv.FormatInt(n.Add(1), 10)
			if err := h.ServeHTTP(w, benchRequest(key, body, w), next); err != nil || w.status != http.StatusCreated {
				b.Errorf("a new key: status %d, error %v", w.status, err)
				return
			}
		}
	})
}

// BenchmarkRequestSetup is the cost of building a request in the
// benchmarks above, to subtract from them.
func BenchmarkRequestSetup(b *testing.B) {
	body := benchJSON()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	for b.Loop() {
		w := newBenchWriter()
		_ = benchRequest("replayed", body, w)
	}
}

// benchNewKeys serves h a new key per iteration, with the same body each
// time or (newBodies) a body of its own.
func benchNewKeys(b *testing.B, h *Handler, newBodies bool) {
	body := benchJSON()
	next := nopNext()
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.SetBytes(int64(len(body)))
	i := 0
	for b.Loop() {
		w := newBenchWriter()
		i++
		sent := body
		if newBodies {
			sent = append(append(strconv.AppendInt(append(body[:0:0], `{"amount":`...), int64(i), 10), ','), body[1:]...)
		}
		serveCreated(b, h, w, benchRequest("new-"+strconv.Itoa(i), sent, w), next)
	}
}

// BenchmarkReplayGzip is BenchmarkReplay with the body gzipped, and
// BenchmarkReplayZstd in zstd: what decoding a coded body adds to a replay
// (a body sent as it is pays nothing of it).
func BenchmarkReplayGzip(b *testing.B) { benchCodedReplays(b, "gzip") }

func BenchmarkReplayZstd(b *testing.B) { benchCodedReplays(b, "zstd") }

func benchCodedReplays(b *testing.B, coding string) {
	h := benchHandler(b)
	var buf bytes.Buffer
	var zw io.WriteCloser = gzip.NewWriter(&buf)
	if coding == "zstd" {
		zw, _ = zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	}
	_, _ = zw.Write(benchJSON())
	_ = zw.Close()
	body := buf.Bytes()
	next := nopNext()
	request := func(w http.ResponseWriter) *http.Request {
		r := benchRequest("replayed", body, w)
		r.Header.Set("Content-Encoding", coding)
		return r
	}
	w := newBenchWriter()
	serveCreated(b, h, w, request(w), next)
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.SetBytes(int64(len(benchJSON())))
	for b.Loop() {
		w := newBenchWriter()
		if err := h.ServeHTTP(w, request(w), next); err != nil || w.h.Get("Idempotent-Replayed") != "true" {
			b.Fatalf("not a replay: status %d, error %v", w.status, err)
		}
	}
}

// BenchmarkConflict is a 409: the key is held by a request still running
// (in_flight reject, so that the answer comes at once).
func BenchmarkConflict(b *testing.B) {
	h := benchHandler(b, func(h *Handler) { h.InFlight = inFlightReject })
	body := benchJSON()
	next := nopNext()
	entered, release := make(chan struct{}), make(chan struct{})
	go func() {
		w := newBenchWriter()
		_ = h.ServeHTTP(w, benchRequest("held", body, w), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			close(entered)
			<-release
			return next.ServeHTTP(w, r)
		}))
	}()
	<-entered
	defer close(release)
	benchAnswers(b, h, "held", body, next, http.StatusConflict)
}

// BenchmarkMismatch is a 422: the key was used for a request with
// another body, and the problem names what differs.
func BenchmarkMismatch(b *testing.B) {
	h := benchHandler(b)
	body := benchJSON()
	next := nopNext()
	w := newBenchWriter()
	serveCreated(b, h, w, benchRequest("reused", body, w), next)
	benchAnswers(b, h, "reused", append([]byte(`{"amount":7,`), body[1:]...), next, http.StatusUnprocessableEntity)
}

// benchAnswers sends h the same request (key and body) in a loop, and
// fails b unless each is answered with want.
func benchAnswers(b *testing.B, h *Handler, key string, body []byte, next caddyhttp.Handler, want int) {
	b.ReportAllocs()
	defer cpuPerOp(b)()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		w := newBenchWriter()
		if err := h.ServeHTTP(w, benchRequest(key, body, w), next); err != nil || w.status != want {
			b.Fatalf("status %d, error %v; want %d", w.status, err, want)
		}
	}
}

package model

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Caddy modules of the model, registered only in the programs that import
// this package (its tests): a tracker in front of everything that says
// when Caddy is done with a request, a fault handler in front of the
// upstream that panics when told to, and a log writer the model scans.

func init() {
	caddy.RegisterModule(trackHandler{})
	caddy.RegisterModule(faultHandler{})
	caddy.RegisterModule(logWriter{})
}

// deliberatePanic is the value the fault handler panics with; any other
// panic in Caddy's log is an anomaly.
const deliberatePanic = "model: deliberate panic"

// tracker records when Caddy is done with each attempt: when the
// outermost handler has returned, the idempotency handlers inside it have
// completed or released their records.
var tracker = struct {
	mu      sync.Mutex
	done    map[string]chan struct{}
	at      map[string]time.Time
	started map[string]bool
	reached map[string]time.Time // when the fault handler (in front of the upstream) got it
}{done: make(map[string]chan struct{}), at: make(map[string]time.Time), started: make(map[string]bool), reached: make(map[string]time.Time)}

// markReached says that attempt id reached the handler in front of the
// upstream: the idempotency handlers let it through (it owns its key).
func markReached(id string, at time.Time) {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	if _, ok := tracker.reached[id]; !ok {
		tracker.reached[id] = at
	}
}

// reachedAt is when attempt id reached the handler in front of the
// upstream, zero if it never did.
func reachedAt(id string) time.Time {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	return tracker.reached[id]
}

// markStarted says that Caddy's handlers got attempt id.
func markStarted(id string) {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	tracker.started[id] = true
}

// started reports whether Caddy's handlers ever got attempt id.
func started(id string) bool {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	return tracker.started[id]
}

func trackerChan(id string) chan struct{} {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	ch := tracker.done[id]
	if ch == nil {
		ch = make(chan struct{})
		tracker.done[id] = ch
	}
	return ch
}

// markDone says that Caddy is done with attempt id.
func markDone(id string, at time.Time) {
	ch := trackerChan(id)
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	if _, ok := tracker.at[id]; !ok {
		tracker.at[id] = at
		close(ch)
	}
}

// waitDone waits up to d for Caddy to be done with attempt id, and
// returns when it was, or false.
func waitDone(id string, d time.Duration) (time.Time, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-trackerChan(id):
		tracker.mu.Lock()
		defer tracker.mu.Unlock()
		return tracker.at[id], true
	case <-t.C:
		return time.Time{}, false
	}
}

// forgetTracked drops the tracker's entries of attempts with prefix.
func forgetTracked(prefix string) {
	tracker.mu.Lock()
	defer tracker.mu.Unlock()
	for id := range tracker.done {
		if strings.HasPrefix(id, prefix) {
			delete(tracker.done, id)
			delete(tracker.at, id)
		}
	}
	for id := range tracker.started {
		if strings.HasPrefix(id, prefix) {
			delete(tracker.started, id)
		}
	}
	for id := range tracker.reached {
		if strings.HasPrefix(id, prefix) {
			delete(tracker.reached, id)
		}
	}
}

// clockForModules is the model's clock, shared with the modules.
var clockForModules = time.Now

// trackHandler is http.handlers.model_track.
type trackHandler struct{}

func (trackHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.model_track", New: func() caddy.Module { return new(trackHandler) }}
}

func (trackHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	id := r.Header.Get(HeaderReq)
	markStarted(id)
	defer func() { markDone(id, clockForModules()) }() // on a panic too
	return next.ServeHTTP(w, r)
}

// faultHandler is http.handlers.model_fault: it panics before the next
// handler runs, or once the next handler has written its final status.
type faultHandler struct{}

func (faultHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.model_fault", New: func() caddy.Module { return new(faultHandler) }}
}

func (faultHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	markReached(r.Header.Get(HeaderReq), clockForModules())
	b, _ := ParseBehaviour(r.Header.Get(HeaderDo))
	switch b.Panic {
	case "before":
		panic(deliberatePanic)
	case "after":
		pw := &panickyWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
		err := next.ServeHTTP(pw, r)
		if pw.status != 0 {
			panic(deliberatePanic)
		}
		return err
	}
	return next.ServeHTTP(w, r)
}

// panickyWriter panics at the first body write after a final status.
type panickyWriter struct {
	*caddyhttp.ResponseWriterWrapper
	status int
}

func (p *panickyWriter) WriteHeader(code int) {
	if code >= 200 && p.status == 0 {
		p.status = code
	}
	p.ResponseWriterWrapper.WriteHeader(code)
}

func (p *panickyWriter) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.WriteHeader(http.StatusOK)
	}
	panic(deliberatePanic)
}

func (p *panickyWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{p}, r)
}

// logs is what Caddy logged in the current trial (ERROR and up).
var logs = struct {
	mu  sync.Mutex
	buf bytes.Buffer
}{}

// takeLogs returns and forgets what was logged.
func takeLogs() string {
	logs.mu.Lock()
	defer logs.mu.Unlock()
	s := logs.buf.String()
	logs.buf.Reset()
	return s
}

// logWriter is caddy.logging.writers.model.
type logWriter struct{}

func (logWriter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.logging.writers.model", New: func() caddy.Module { return new(logWriter) }}
}

func (logWriter) String() string    { return "model" }
func (logWriter) WriterKey() string { return "model" }
func (logWriter) OpenWriter() (io.WriteCloser, error) {
	return logSink{}, nil
}

type logSink struct{}

func (logSink) Write(p []byte) (int, error) {
	logs.mu.Lock()
	defer logs.mu.Unlock()
	return logs.buf.Write(p)
}

func (logSink) Close() error { return nil }

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = trackHandler{}
	_ caddyhttp.MiddlewareHandler = faultHandler{}
	_ caddy.WriterOpener          = logWriter{}
)

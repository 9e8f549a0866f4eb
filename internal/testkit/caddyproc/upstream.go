package caddyproc

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is an HTTP server that counts executions per Idempotency-Key.
// Every response carries X-Key-Execution, the request's execution number
// for its key (also in the JSON body of the default answer). Requests
// control it with headers:
//
//	X-Upstream-Delay:       milliseconds to work before answering; the work
//	                        is finished even if the caller goes away
//	X-Upstream-Status:      the status to answer with (default 201)
//	X-Upstream-Break-After: n: break off mid-body. The response declares a
//	                        Content-Length larger than n, sends the status,
//	                        the headers and n bytes of Pattern, flushes,
//	                        then closes the connection (hijacked): an
//	                        upstream that crashed half-way through its
//	                        answer
//	X-Upstream-Size:        n: answer with n bytes of Pattern (declared in
//	                        Content-Length) instead of the JSON body, sent
//	                        in chunks of ChunkSize, each flushed
//	X-Upstream-Chunk-Delay: with X-Upstream-Size, milliseconds to pause
//	                        after each chunk: a slow download
//	X-Upstream-Unsized:     with X-Upstream-Size, "true": declare no
//	                        Content-Length, so that only the end of the
//	                        stream tells a client the answer is whole
//	X-Upstream-Fail:        once the request is read and the work done
//	                        (X-Upstream-Delay): "reset" resets the
//	                        connection (SO_LINGER 0) and "eof" closes it,
//	                        without a status: an upstream that acted and
//	                        crashed before answering; "reset-body" sends
//	                        the status, the headers and 64 bytes of a
//	                        larger declared body, then resets. (A proxy's
//	                        "timeout" and "refused" are the config's: the
//	                        upstream ignores them.)
//	X-Upstream-Silence:     with X-Upstream-Size, "<n>:<ms>": once n bytes
//	                        of the answer are sent and flushed (0: the
//	                        status and headers alone), send nothing for
//	                        ms milliseconds, then the rest: a stream that
//	                        pauses (SSE, an LLM, a long computation after
//	                        the headers)
//
// Every response also carries X-Execution, the request's number among all
// the upstream served.
//
// Executions are counted when a request arrives; Finished and Delivered
// tell how the answers ended.
type Upstream struct {
	Addr string

	opts     UpstreamOptions
	total    atomic.Int64
	mu       sync.Mutex
	perKey   map[string]*keyStats
	srv      *http.Server
	listener net.Listener
}

// UpstreamOptions make an Upstream tell more about what it did.
type UpstreamOptions struct {
	// Echo names request headers whose values the default JSON answer
	// repeats (in "echo"), beside the request's Idempotency-Key ("key"),
	// so that whoever gets the answer can tell whose request it answers.
	// Never name a credential in tests that check where credentials end
	// up: the answer is recorded in the store.
	Echo []string
	// OnExecution, when set, is called with every request served, once
	// its handler has returned (the answer written or broken off).
	OnExecution func(Execution)
}

// Execution is one request the upstream served, for a history of them.
type Execution struct {
	N            int64  // its number among all requests served (X-Execution)
	KeyExecution int    // its number among the requests with its key
	Path         string // the request's URL path
	Header       http.Header
	Body         []byte // the request's body
	Start, End   time.Time
	Status       int    // the status sent
	Answer       []byte // the body bytes written
	BrokeOff     bool   // the answer broke off mid-body (X-Upstream-Break-After, reset-body)
	Delivered    bool   // the whole answer was written
	Failed       string // how X-Upstream-Fail made it fail ("" when it did not)
}

// ChunkSize is the size of the chunks of an X-Upstream-Size answer.
const ChunkSize = 8 << 10

// keyStats is what happened to the requests with one key.
type keyStats struct {
	executions int // requests that arrived
	finished   int // requests whose handler has returned
	delivered  int // of those, the ones whose whole answer was written
}

// NewUpstream starts an Upstream on a free loopback port.
func NewUpstream() (*Upstream, error) { return NewUpstreamWith(UpstreamOptions{}) }

// NewUpstreamWith starts an Upstream with opts on a free loopback port.
func NewUpstreamWith(opts UpstreamOptions) (*Upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Addr: l.Addr().String(), opts: opts, perKey: make(map[string]*keyStats), listener: l}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(l) }()
	return u, nil
}

// ServeHTTP implements http.Handler.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	n := u.total.Add(1)
	u.mu.Lock()
	st := u.perKey[key]
	if st == nil {
		st = new(keyStats)
		u.perKey[key] = st
	}
	st.executions++
	exec := st.executions
	u.mu.Unlock()
	x := Execution{N: n, KeyExecution: exec, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Start: time.Now()}
	tw := &teeWriter{ResponseWriter: w, keep: u.opts.OnExecution != nil}
	w = tw
	delivered := false
	defer func() {
		u.mu.Lock()
		st.finished++
		if delivered {
			st.delivered++
		}
		u.mu.Unlock()
		if u.opts.OnExecution != nil {
			x.End, x.Status, x.Answer, x.Delivered = time.Now(), tw.status, tw.written, delivered
			u.opts.OnExecution(x)
		}
	}()

	if ms, err := strconv.Atoi(r.Header.Get("X-Upstream-Delay")); err == nil && ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	status := http.StatusCreated
	if s, err := strconv.Atoi(r.Header.Get("X-Upstream-Status")); err == nil {
		status = s
	}
	w.Header().Set("X-Key-Execution", strconv.Itoa(exec))
	w.Header().Set("X-Execution", strconv.FormatInt(n, 10))
	rc := http.NewResponseController(w)

	switch fail := r.Header.Get("X-Upstream-Fail"); fail {
	case "reset", "eof", "reset-body":
		x.Failed = fail
		if fail == "reset-body" {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.Itoa(64+(1<<20)))
			w.WriteHeader(status)
			_, _ = w.Write(Pattern(64))
			_ = rc.Flush()
			x.BrokeOff = true
			// The status reached the proxy before the reset.
			time.Sleep(20 * time.Millisecond)
		}
		if conn, _, err := rc.Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok && fail != "eof" {
				_ = tc.SetLinger(0)
			}
			conn.Close()
		}
		return
	}

	if size, err := strconv.Atoi(r.Header.Get("X-Upstream-Break-After")); err == nil && size >= 0 {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(size+(1<<20)))
		w.WriteHeader(status)
		_, _ = w.Write(Pattern(size))
		_ = rc.Flush()
		if conn, _, err := rc.Hijack(); err == nil {
			conn.Close()
		}
		x.BrokeOff = true
		return
	}

	if size, err := strconv.Atoi(r.Header.Get("X-Upstream-Size")); err == nil && size >= 0 {
		pause, _ := strconv.Atoi(r.Header.Get("X-Upstream-Chunk-Delay"))
		w.Header().Set("Content-Type", "application/octet-stream")
		if r.Header.Get("X-Upstream-Unsized") != "true" {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		w.WriteHeader(status)
		silentAt, silence := parseSilence(r.Header.Get("X-Upstream-Silence"))
		all, sent := Pattern(size), 0
		for {
			if sent == silentAt && silence > 0 {
				if err := rc.Flush(); err != nil {
					return
				}
				time.Sleep(silence)
			}
			if len(all) == 0 {
				break
			}
			n := min(ChunkSize, len(all))
			if sent < silentAt {
				n = min(n, silentAt-sent)
			}
			chunk := all[:n]
			all, sent = all[n:], sent+n
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			if pause > 0 && len(all) > 0 {
				time.Sleep(time.Duration(pause) * time.Millisecond)
			}
		}
		delivered = true
		return
	}

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err := w.Write(u.answer(n, exec, key, len(body), r.Header))
	delivered = err == nil
}

// parseSilence reads X-Upstream-Silence, "<bytes>:<ms>": where the
// answer pauses and for how long (no pause: -1, 0).
func parseSilence(v string) (at int, d time.Duration) {
	before, after, ok := strings.Cut(v, ":")
	n, err1 := strconv.Atoi(before)
	ms, err2 := strconv.Atoi(after)
	if !ok || err1 != nil || err2 != nil || n < 0 || ms <= 0 {
		return -1, 0
	}
	return n, time.Duration(ms) * time.Millisecond
}

// answer is the default JSON answer: the execution numbers, the request's
// size and, with Echo, its key and echoed headers.
func (u *Upstream) answer(n int64, exec int, key string, size int, h http.Header) []byte {
	v := struct {
		Execution    int64             `json:"execution"`
		KeyExecution int               `json:"key_execution"`
		RequestBytes int               `json:"request_bytes"`
		Key          *string           `json:"key,omitempty"`
		Echo         map[string]string `json:"echo,omitempty"`
	}{Execution: n, KeyExecution: exec, RequestBytes: size}
	if u.opts.Echo != nil {
		v.Key = &key
		v.Echo = make(map[string]string, len(u.opts.Echo))
		for _, name := range u.opts.Echo {
			v.Echo[name] = h.Get(name)
		}
	}
	b, _ := json.Marshal(v)
	return b
}

// teeWriter keeps the status and the body bytes written, for an
// Execution. It forwards what http.ResponseController needs (Flush,
// Hijack) through Unwrap.
type teeWriter struct {
	http.ResponseWriter
	keep    bool // keep the body bytes
	status  int  // the final status
	written []byte
}

func (t *teeWriter) WriteHeader(code int) {
	if t.status == 0 && code >= 200 {
		t.status = code
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *teeWriter) Write(p []byte) (int, error) {
	if t.status == 0 {
		t.status = http.StatusOK
	}
	n, err := t.ResponseWriter.Write(p)
	if t.keep {
		t.written = append(t.written, p[:n]...)
	}
	return n, err
}

func (t *teeWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// Pattern is the body of the sized answers: n bytes that show where a
// piece was cut from (each 8-byte group is its own offset, in hex).
func Pattern(n int) []byte {
	b := make([]byte, 0, n+8)
	for i := 0; len(b) < n; i += 8 {
		b = fmt.Appendf(b, "%07x\n", i)
	}
	return b[:n]
}

// Total is the number of requests served.
func (u *Upstream) Total() int64 { return u.total.Load() }

// Executions returns how many times requests with key arrived.
func (u *Upstream) Executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st := u.perKey[key]; st != nil {
		return st.executions
	}
	return 0
}

// Finished returns how many requests with key have been answered, whole
// or not (a broken-off answer, a caller that stopped reading).
func (u *Upstream) Finished(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st := u.perKey[key]; st != nil {
		return st.finished
	}
	return 0
}

// Delivered returns how many requests with key got their whole answer
// written (the caller read it to the end, as far as the upstream can
// tell).
func (u *Upstream) Delivered(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st := u.perKey[key]; st != nil {
		return st.delivered
	}
	return 0
}

// Close stops the server.
func (u *Upstream) Close() error { return u.srv.Close() }

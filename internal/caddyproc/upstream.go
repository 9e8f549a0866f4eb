package caddyproc

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is an HTTP server that counts executions per Idempotency-Key.
// Requests control it with headers:
//
//	X-Upstream-Delay:  milliseconds to work before answering; the work is
//	                   finished even if the caller goes away
//	X-Upstream-Status: the status to answer with (default 201)
type Upstream struct {
	Addr string

	total    atomic.Int64
	mu       sync.Mutex
	perKey   map[string]int
	srv      *http.Server
	listener net.Listener
}

// NewUpstream starts an Upstream on a free loopback port.
func NewUpstream() (*Upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Addr: l.Addr().String(), perKey: make(map[string]int), listener: l}
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
	u.perKey[key]++
	exec := u.perKey[key]
	u.mu.Unlock()

	if ms, err := strconv.Atoi(r.Header.Get("X-Upstream-Delay")); err == nil && ms > 0 {
		time.Sleep(time.Duration(ms) * time.Millisecond)
	}
	status := http.StatusCreated
	if s, err := strconv.Atoi(r.Header.Get("X-Upstream-Status")); err == nil {
		status = s
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"execution":%d,"key_execution":%d,"request_bytes":%d}`, n, exec, len(body))
}

// Total is the number of requests served.
func (u *Upstream) Total() int64 { return u.total.Load() }

// Executions returns how many times requests with key were served.
func (u *Upstream) Executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.perKey[key]
}

// Close stops the server.
func (u *Upstream) Close() error { return u.srv.Close() }

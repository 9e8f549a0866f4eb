package main

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// upstream is the application behind Caddy: it reads the body and answers
// 201 with a small JSON document, counting executions. It is as cheap as
// a handler can be, so the benchmark measures Caddy, not the application.
type upstream struct {
	addr  string
	calls atomic.Int64
	srv   *http.Server

	// Requests to holdPath wait until the gate of their time is closed
	// (the renewal runs, renewals.go): the long requests that hold leases.
	holding atomic.Int64
	gate    atomic.Pointer[chan struct{}]
}

// holdPath is the path of the requests the upstream holds.
const holdPath = "/hold"

// holdLimit bounds how long the upstream holds a request, should the
// benchmark fail before it lets them go.
const holdLimit = 10 * time.Minute

// hold makes the upstream hold the requests to holdPath from now on,
// until release is called.
func (u *upstream) hold() (release func()) {
	gate := make(chan struct{})
	u.gate.Store(&gate)
	return func() { close(gate) }
}

var upstreamBody = []byte(`{"id":"ord_1f8a3c","status":"created","amount":1000,"currency":"eur"}`)

func startUpstream() (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{addr: l.Addr().String()}
	u.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.calls.Add(1)
		if r.URL.Path == holdPath {
			if gate := u.gate.Load(); gate != nil {
				u.holding.Add(1)
				select {
				case <-*gate:
				case <-time.After(holdLimit):
				}
				u.holding.Add(-1)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(upstreamBody)
	})}
	// HTTP/2 without TLS too, for the held requests (renewals.go).
	u.srv.Protocols = new(http.Protocols)
	u.srv.Protocols.SetHTTP1(true)
	u.srv.Protocols.SetUnencryptedHTTP2(true)
	u.srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
	go func() { _ = u.srv.Serve(l) }()
	return u, nil
}

package model

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// Proto is the protocol an attempt is sent over. HTTP/1.1 goes over raw
// sockets as the model writes it byte for byte (hostile header forms
// included); the others through Go's clients, to Caddy's TLS server
// (HTTP/2, HTTP/3) or its plain one (h2c).
type Proto = caddyproc.Proto

const (
	H1  = caddyproc.H1
	H2  = caddyproc.H2
	H2C = caddyproc.H2C
	H3  = caddyproc.H3
)

// TLSServer is where Caddy serves HTTP/1.1, HTTP/2 and HTTP/3 with TLS:
// its port (TCP and UDP) and the certificate it serves.
type TLSServer struct {
	Port int
	*caddyproc.Cert
}

// NewTLSServer makes a certificate for localhost in dir.
func NewTLSServer(dir string, port int) (*TLSServer, error) {
	c, err := caddyproc.NewCert(dir)
	if err != nil {
		return nil, err
	}
	return &TLSServer{Port: port, Cert: c}, nil
}

// sendHTTP sends a over p with Go's client and reads the answer as its
// mode says. plain is the address of Caddy's plain server (h2c).
func sendHTTP(plain string, tlsSrv *TLSServer, p Proto, a *Attempt, clock func() time.Time) *Result {
	res := &Result{Sent: clock()}
	defer func() { res.Done = clock() }()
	rt := tlsSrv.Transport(p, a.Mode == SlowRead || a.Mode == StallResume)
	defer caddyproc.CloseTransport(rt)

	base := fmt.Sprintf("https://127.0.0.1:%d", tlsSrv.Port)
	if p == H2C {
		base = "http://" + plain
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var body io.Reader
	if sent := a.bodyOnWire(); len(sent) > 0 || a.Method == http.MethodPost || a.Method == http.MethodPut || a.Method == http.MethodPatch {
		body = bytes.NewReader(sent)
		if a.Chunked {
			body = io.MultiReader(bytes.NewReader(sent)) // no length: streamed
		}
	}
	if a.Mode == HangUp {
		// Hang up once the request is written: the client goes away.
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { cancel() }})
	}
	req, err := http.NewRequestWithContext(ctx, a.Method, base+a.Target, body)
	if err != nil {
		res.NoAnswer, res.Err = true, "request: "+err.Error()
		return res
	}
	req.Host = a.hostOnWire(p != H2C)
	for _, kv := range a.headerOnWire() {
		req.Header.Add(kv[0], kv[1])
	}
	req.Header.Set(HeaderReq, a.ID)
	req.Header.Set(HeaderIntent, a.Intent)
	req.Header.Set(HeaderDo, a.Do.String())
	resp, err := rt.RoundTrip(req)
	if err != nil {
		res.NoAnswer, res.Err = true, "round trip: "+err.Error()
		if a.Mode == HangUp {
			res.Err = "hung up"
		}
		return res
	}
	defer resp.Body.Close()
	res.Status, res.Header = resp.StatusCode, resp.Header
	if a.Mode == StopReading {
		time.Sleep(a.Stall)
		res.Err = "stopped reading"
		return res
	}
	got, err := readBody(resp.Body, a)
	res.Trailer = resp.Trailer
	if err != nil {
		res.BrokeOff, res.Err = true, "reading the body: "+err.Error()
	}
	res.Body = decoded(res, got)
	return res
}

// readBody reads an answer's body as a's mode says: at once, slowly (a's
// Rate bytes a second), or after a stall (a.Stall) from which it resumes.
func readBody(body io.Reader, a *Attempt) ([]byte, error) {
	switch a.Mode {
	case SlowRead:
		return caddyproc.ReadSlowly(body, a.Rate)
	case StallResume:
		time.Sleep(a.Stall)
	}
	return io.ReadAll(body)
}

// decoded returns body gunzipped when the answer says gzip (and it came
// whole); an error decoding goes into res.Err.
func decoded(res *Result, body []byte) []byte {
	if res.Header.Get("Content-Encoding") != "gzip" || res.BrokeOff {
		return body
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		if len(body) > 0 {
			res.Err = "gunzip: " + err.Error()
		}
		return body
	}
	dec, err := io.ReadAll(zr)
	if err != nil {
		res.Err = "gunzip: " + err.Error()
		return body
	}
	return dec
}

// wellFormed reports whether a can go over HTTP/2 or HTTP/3: Go's
// clients refuse (or rewrite) what only raw HTTP/1.1 can carry, such as
// control bytes, several key lines in one order, or a Host that differs
// from the request's authority in odd ways.
func (a *Attempt) wellFormed() bool {
	seen := map[string]bool{}
	for _, kv := range a.Header {
		k := strings.ToLower(kv[0])
		if seen[k] || !isToken(k) || strings.ContainsAny(kv[1], "\r\n\x00") || a.hasControlBytes() {
			return false
		}
		seen[k] = true
		for i := 0; i < len(kv[1]); i++ {
			if kv[1][i] >= 0x80 {
				return false
			}
		}
	}
	return true
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

package model

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// ClientMode is how a client treats its connection.
type ClientMode uint8

const (
	// ReadAll reads the whole answer.
	ReadAll ClientMode = iota
	// HangUp closes the connection right after sending the request.
	HangUp
	// StopReading reads the status and headers, then reads nothing more
	// for Attempt.Stall before closing.
	StopReading
)

func (m ClientMode) String() string {
	return [...]string{"read-all", "hang-up", "stop-reading"}[m]
}

// Attempt is one request the model sends.
type Attempt struct {
	ID     string // X-Model-Req
	Intent string // X-Model-Intent: scope label and key
	Method string
	Target string // path and query
	Host   string
	// Header lines in order, sent as they are: hostile keys included.
	Header  [][2]string
	Body    []byte
	Chunked bool
	Mode    ClientMode
	Stall   time.Duration // StopReading
	Do      Behaviour
}

// Result is what the client got.
type Result struct {
	Sent, Done time.Time
	// NoAnswer: the connection ended before a final status (or the client
	// hung up and never looked).
	NoAnswer bool
	Status   int
	Header   http.Header
	Body     []byte // decoded when the answer was gzip
	Trailer  http.Header
	// BrokeOff: the body ended early.
	BrokeOff bool
	Err      string
}

// header returns the first value of the attempt's header line name.
func (a *Attempt) header(name string) (string, bool) {
	for _, kv := range a.Header {
		if strings.EqualFold(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
}

// headerValues returns every value of the attempt's header lines name.
func (a *Attempt) headerValues(name string) []string {
	var out []string
	for _, kv := range a.Header {
		if strings.EqualFold(kv[0], name) {
			out = append(out, kv[1])
		}
	}
	return out
}

// wire returns the request as bytes on the wire.
func (a *Attempt) wire() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", a.Method, a.Target, a.Host)
	for _, kv := range a.Header {
		fmt.Fprintf(&b, "%s: %s\r\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "%s: %s\r\n%s: %s\r\n%s: %s\r\nConnection: close\r\n", HeaderReq, a.ID, HeaderIntent, a.Intent, HeaderDo, a.Do)
	if a.Chunked {
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for rest := a.Body; len(rest) > 0; {
			chunk := rest[:min(len(rest), 1000)]
			rest = rest[len(chunk):]
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		b.WriteString("0\r\n\r\n")
	} else {
		if len(a.Body) > 0 || a.Method == http.MethodPost || a.Method == http.MethodPut || a.Method == http.MethodPatch {
			fmt.Fprintf(&b, "Content-Length: %d\r\n", len(a.Body))
		}
		b.WriteString("\r\n")
		b.Write(a.Body)
	}
	return b.Bytes()
}

// Send sends a to addr on a connection of its own and reads the answer as
// its mode says. clock stamps the times.
func Send(addr string, a *Attempt, clock func() time.Time) *Result {
	res := &Result{Sent: clock()}
	defer func() { res.Done = clock() }()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		res.NoAnswer, res.Err = true, "dial: "+err.Error()
		return res
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write(a.wire()); err != nil {
		res.NoAnswer, res.Err = true, "write: "+err.Error()
		return res
	}
	if a.Mode == HangUp {
		res.NoAnswer, res.Err = true, "hung up"
		return res
	}
	br := bufio.NewReader(c)
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			res.NoAnswer, res.Err = true, "reading the answer: "+err.Error()
			return res
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode < 100 {
			break
		}
		_ = resp.Body.Close() // an interim answer: read on
	}
	res.Status, res.Header = resp.StatusCode, resp.Header
	if a.Mode == StopReading {
		time.Sleep(a.Stall)
		res.Err = "stopped reading"
		return res
	}
	body, err := io.ReadAll(resp.Body)
	res.Trailer = resp.Trailer
	if err != nil {
		res.BrokeOff, res.Err = true, "reading the body: "+err.Error()
	}
	if resp.Header.Get("Content-Encoding") == "gzip" && !res.BrokeOff {
		if zr, zerr := gzip.NewReader(bytes.NewReader(body)); zerr == nil {
			if dec, derr := io.ReadAll(zr); derr == nil {
				body = dec
			} else {
				res.Err = "gunzip: " + derr.Error()
			}
		} else if len(body) > 0 {
			res.Err = "gunzip: " + zerr.Error()
		}
	}
	res.Body = body
	return res
}

// describe renders r for failure messages.
func (r *Result) describe() string {
	if r == nil {
		return "<not sent>"
	}
	if r.NoAnswer {
		return "no answer (" + r.Err + ")"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", r.Status)
	for _, name := range sortedKeys(r.Header) {
		if name == "Date" {
			continue
		}
		fmt.Fprintf(&b, " %s=%q", name, r.Header[name])
	}
	body := string(r.Body)
	if len(body) > 160 {
		body = body[:160] + "..."
	}
	fmt.Fprintf(&b, " body=%q", body)
	if len(r.Trailer) > 0 {
		fmt.Fprintf(&b, " trailer=%v", r.Trailer)
	}
	if r.Err != "" {
		fmt.Fprintf(&b, " err=%q", r.Err)
	}
	return b.String()
}

// short renders the attempt in one line.
func (a *Attempt) short() string {
	return fmt.Sprintf("%s %s do=%s headers=%q body=%.100q chunked=%v mode=%s", a.Method, a.Target, a.Do, a.Header, a.Body, a.Chunked, a.Mode)
}

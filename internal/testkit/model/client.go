package model

import (
	"bufio"
	"bytes"
	"fmt"
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
	// SlowRead reads the whole answer at Attempt.Rate bytes a second,
	// through small receive windows: a phone on a bad network.
	SlowRead
	// StallResume reads the status and headers, reads nothing for
	// Attempt.Stall, then reads the rest: a phone that slept.
	StallResume
)

func (m ClientMode) String() string {
	return [...]string{"read-all", "hang-up", "stop-reading", "slow-read", "stall-resume"}[m]
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
	// Form is how the request is spelt on the wire (form.go): Host,
	// Header and Body are its plain spelling, which the oracle judges.
	Form  Form
	Mode  ClientMode
	Stall time.Duration // StopReading, StallResume
	Rate  int           // SlowRead: bytes a second
	Proto Proto
	// Path b sends the attempt through the handlers of path b (see
	// Config.JSON), Site fill to the fill site.
	Path, Site string
	Do         Behaviour
	// Leases, in a scenario, is how long the upstream takes to answer, in
	// leases of the handler (Do.Delay is set from it when it runs).
	Leases float64
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
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", a.Method, a.Target, a.hostOnWire(false))
	for _, kv := range a.headerOnWire() {
		fmt.Fprintf(&b, "%s: %s\r\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "%s: %s\r\n%s: %s\r\n%s: %s\r\nConnection: close\r\n", HeaderReq, a.ID, HeaderIntent, a.Intent, HeaderDo, a.Do)
	if a.Path != "" {
		fmt.Fprintf(&b, "%s: %s\r\n", HeaderPath, a.Path)
	}
	if a.Site != "" {
		fmt.Fprintf(&b, "%s: %s\r\n", HeaderSite, a.Site)
	}
	body := a.bodyOnWire()
	if a.Chunked {
		b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for rest := body; len(rest) > 0; {
			chunk := rest[:min(len(rest), 1000)]
			rest = rest[len(chunk):]
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		b.WriteString("0\r\n\r\n")
	} else {
		if len(body) > 0 || a.Method == http.MethodPost || a.Method == http.MethodPut || a.Method == http.MethodPatch {
			fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
		}
		b.WriteString("\r\n")
		b.Write(body)
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
	if a.Mode == SlowRead || a.Mode == StallResume {
		// A small receive buffer, so that the server's writes wait for
		// this client as they would for a slow network.
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	}
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
	body, err := readBody(resp.Body, a)
	res.Trailer = resp.Trailer
	if err != nil {
		res.BrokeOff, res.Err = true, "reading the body: "+err.Error()
	}
	res.Body = decoded(res, body)
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
	s := fmt.Sprintf("%s %s do=%s headers=%q body=%.100q chunked=%v mode=%s", a.Method, a.Target, a.Do, a.Header, a.Body, a.Chunked, a.Mode)
	if f := a.Form.String(); f != "" {
		s += " form=(" + f + ")"
	}
	return s
}

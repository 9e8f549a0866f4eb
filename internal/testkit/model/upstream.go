package model

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ResponseHeaderTimeout is the response_header_timeout of the proxy that
// attempts with Fail FailTimeout take; the upstream answers them after
// TimeoutDelay, well past it.
const (
	ResponseHeaderTimeout = 300 * time.Millisecond
	TimeoutDelay          = 4 * ResponseHeaderTimeout
)

// Upstream is a raw HTTP/1.1 server behind Caddy's reverse_proxy. Each
// request carries its Behaviour (header X-Model-Do) and its attempt id
// (X-Model-Req); the upstream answers with exactly those bytes, including
// what Go's own server would refuse to send (a status of 042, a body cut
// off mid-way), and logs every execution with what it received and sent.
type Upstream struct {
	Addr string

	ln    net.Listener
	clock func() time.Time

	mu    sync.Mutex
	execs map[string]*Execution // by attempt id
	order []*Execution
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Execution is one request that reached the upstream.
type Execution struct {
	Req     string // the attempt id
	Seq     int    // 1, 2, ... in arrival order
	Arrived time.Time

	// What arrived.
	Method   string
	Path     string
	Header   http.Header
	Body     []byte
	BodyErr  string // reading the request body failed
	Chunked  bool
	Behavior Behaviour

	// What was sent back.
	Sent     *SentResponse
	Finished time.Time // when the answer was written (or given up)
}

// SentResponse is what the upstream answered.
type SentResponse struct {
	Status   int
	Header   http.Header // the headers the upstream set
	Body     []byte      // the decoded body (before any gzip it applied)
	Wire     []byte      // the body bytes as sent (gzip when it compressed)
	Trailer  http.Header
	BrokeOff bool // the connection was closed before the body ended
	NoAnswer bool // the connection was closed before any status
}

// NewUpstream starts an Upstream on a free loopback port.
func NewUpstream(clock func() time.Time) (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Addr: ln.Addr().String(), ln: ln, clock: clock,
		execs: make(map[string]*Execution), conns: make(map[net.Conn]struct{})}
	u.wg.Add(1)
	go u.accept()
	return u, nil
}

func (u *Upstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = struct{}{}
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			u.serve(c)
			u.mu.Lock()
			delete(u.conns, c)
			u.mu.Unlock()
			c.Close()
		}()
	}
}

// Close stops the upstream and waits for its connections to end.
func (u *Upstream) Close() {
	u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// Execution returns the execution of attempt req, nil if it never arrived.
// Its answer may still be under way: see Settled.
func (u *Upstream) Execution(req string) *Execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[req]
}

// Settled waits up to d for the execution of attempt req to have ended
// its answer, and returns a copy of it (nil if it never arrived).
func (u *Upstream) Settled(req string, d time.Duration) *Execution {
	deadline := time.Now().Add(d)
	for {
		u.mu.Lock()
		e := u.execs[req]
		var c *Execution
		if e != nil && !e.Finished.IsZero() && e.Sent != nil {
			cp := *e
			c = &cp
		}
		u.mu.Unlock()
		if e == nil || c != nil || time.Now().After(deadline) {
			if e != nil && c == nil {
				u.mu.Lock()
				cp := *e
				u.mu.Unlock()
				if cp.Sent == nil {
					cp.Sent = &SentResponse{NoAnswer: true}
				}
				return &cp
			}
			return c
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Executions returns every execution so far, in arrival order.
func (u *Upstream) Executions() []*Execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*Execution(nil), u.order...)
}

// Reset forgets the executions (between trials).
func (u *Upstream) Reset() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.execs = make(map[string]*Execution)
	u.order = nil
}

// InFlight counts executions whose answer has not ended.
func (u *Upstream) InFlight() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, e := range u.order {
		if e.Finished.IsZero() {
			n++
		}
	}
	return n
}

func (u *Upstream) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		e := &Execution{
			Req:     req.Header.Get(HeaderReq),
			Arrived: u.clock(),
			Method:  req.Method,
			Path:    req.URL.RequestURI(),
			Header:  req.Header.Clone(),
			Chunked: len(req.TransferEncoding) > 0,
		}
		e.Behavior, _ = ParseBehaviour(req.Header.Get(HeaderDo))
		body, err := io.ReadAll(req.Body)
		e.Body = body
		if err != nil {
			e.BodyErr = err.Error()
		}
		u.mu.Lock()
		e.Seq = len(u.order) + 1
		if e.Req != "" {
			u.execs[e.Req] = e
		}
		u.order = append(u.order, e)
		u.mu.Unlock()

		sent, keep := u.answer(c, e)
		u.mu.Lock()
		e.Sent, e.Finished = sent, u.clock()
		u.mu.Unlock()
		if !keep || err != nil {
			return
		}
	}
}

// answer writes e's answer on c and returns what it sent, and whether
// the connection can serve another request.
func (u *Upstream) answer(c net.Conn, e *Execution) (sent *SentResponse, keep bool) {
	b := e.Behavior
	sent = &SentResponse{Status: b.Status, Header: make(http.Header)}
	delay := b.Delay
	if b.Fail == FailTimeout {
		// Past the proxy's response_header_timeout, whatever the step
		// made of the delay.
		delay = max(delay, TimeoutDelay)
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
	w := bufio.NewWriter(c)
	if b.CloseBeforeStatus {
		// The request was read (and acted on); no status follows.
		resetOnClose(c, b)
		sent.NoAnswer = true
		return sent, false
	}
	for _, code := range b.Interim {
		fmt.Fprintf(w, "HTTP/1.1 %d Interim\r\nLink: </style.css>; rel=preload\r\n\r\n", code)
	}

	if b.Status == 204 || b.Status == 304 {
		fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nX-Model-Exec: %d\r\n%s: %s\r\n\r\n", b.Status, reason(b.Status), e.Seq, HeaderReq, e.Req)
		sent.Header.Set("X-Model-Exec", strconv.Itoa(e.Seq))
		sent.Header.Set(HeaderReq, e.Req)
		return sent, w.Flush() == nil
	}
	body := answerBody(e)
	sent.Body = body
	wire := body
	h := sent.Header
	h.Set("Content-Type", "application/json")
	h.Set("X-Model-Exec", strconv.Itoa(e.Seq))
	h.Set(HeaderReq, e.Req)
	h.Set("Server", "model-upstream")
	if b.Location {
		h.Set("Location", "/orders/"+strconv.Itoa(e.Seq))
	}
	if b.Gzip {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(body)
		_ = zw.Close()
		wire = zb.Bytes()
		h.Set("Content-Encoding", "gzip")
	}
	sent.Wire = wire
	chunked := b.Trailer || b.ChunkDelay > 0 || b.Silence > 0 && b.SilenceAfter == 0
	if b.Trailer {
		h.Set("Trailer", "X-Model-Trailer, Grpc-Status")
		sent.Trailer = http.Header{"X-Model-Trailer": {"t" + strconv.Itoa(e.Seq)}, "Grpc-Status": {"0"}}
	}
	switch {
	case b.BreakAfter >= 0:
		h.Set("Content-Length", strconv.Itoa(len(wire)+1<<20))
	case chunked:
		h.Set("Transfer-Encoding", "chunked")
	default:
		h.Set("Content-Length", strconv.Itoa(len(wire)))
	}
	fmt.Fprintf(w, "HTTP/1.1 %03d %s\r\n", b.Status, reason(b.Status))
	for _, name := range sortedKeys(h) {
		for _, v := range h[name] {
			fmt.Fprintf(w, "%s: %s\r\n", name, v)
		}
	}
	w.WriteString("\r\n")
	if b.BreakAfter >= 0 {
		n := min(b.BreakAfter, len(wire))
		w.Write(wire[:n])
		w.Flush()
		sent.BrokeOff = true
		if b.Reset {
			// The status reached the proxy: let it read it before the
			// reset (a reset mid-body, not before the status).
			time.Sleep(20 * time.Millisecond)
			resetOnClose(c, b)
		}
		return sent, false
	}
	// silent sends nothing for b.Silence once at bytes of the body are
	// out (flushed).
	silentAt := -1
	if b.Silence > 0 {
		silentAt = min(b.SilenceAfter, len(wire))
	}
	silent := func() bool {
		if w.Flush() != nil {
			return false
		}
		time.Sleep(b.Silence)
		return true
	}
	if !chunked {
		if silentAt >= 0 {
			w.Write(wire[:silentAt])
			if !silent() {
				return sent, false
			}
			wire = wire[silentAt:]
		}
		w.Write(wire)
		return sent, w.Flush() == nil
	}
	if silentAt == 0 && !silent() {
		return sent, false
	}
	for rest, at := wire, 0; len(rest) > 0; {
		n := min(len(rest), 4096)
		if at < silentAt {
			n = min(n, silentAt-at)
		}
		chunk := rest[:n]
		rest, at = rest[n:], at+n
		fmt.Fprintf(w, "%x\r\n", len(chunk))
		w.Write(chunk)
		w.WriteString("\r\n")
		if at == silentAt && !silent() {
			return sent, false
		}
		if b.ChunkDelay > 0 {
			if w.Flush() != nil {
				return sent, false
			}
			time.Sleep(b.ChunkDelay)
		}
	}
	w.WriteString("0\r\n")
	for _, name := range sortedKeys(sent.Trailer) {
		fmt.Fprintf(w, "%s: %s\r\n", name, sent.Trailer.Get(name))
	}
	w.WriteString("\r\n")
	return sent, w.Flush() == nil
}

// resetOnClose makes the close of c that follows a reset (SO_LINGER 0)
// when b asks for one: the proxy meets ECONNRESET instead of an EOF.
func resetOnClose(c net.Conn, b Behaviour) {
	if b.Reset {
		_ = c.(*net.TCPConn).SetLinger(0)
	}
}

// answerBody is the JSON body of e's answer: it names the attempt, the
// execution and the key, so that a replay shows whose answer it is, and
// is padded to the behaviour's size.
func answerBody(e *Execution) []byte {
	head := fmt.Sprintf(`{"req":%q,"exec":%d,"intent":%q,"pad":"`, e.Req, e.Seq, e.Header.Get(HeaderIntent))
	const tail = `"}`
	pad := max(0, e.Behavior.Size-len(head)-len(tail))
	return []byte(head + strings.Repeat("x", pad) + tail)
}

func reason(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "Whatever"
}

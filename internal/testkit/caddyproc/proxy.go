package caddyproc

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a server, and can
// cut them: a network partition between Caddy and its store that a test
// starts and ends at will, without touching the (shared) server behind it.
//
// While cut, nothing listens on Addr (connecting is refused at once) and
// every connection that was open has been closed, as if the server had
// gone away. Restore listens on the same port again, so clients configured
// with Addr reconnect on their own.
//
// While stalled, the proxy is a black hole: connections stay open and new
// ones are accepted, but no byte goes through either way, so a client
// learns of the trouble only from its own timeouts. Bytes sent meanwhile
// are held, not lost, and go through once Unstall is called, even when
// their sender has closed its connection since: like segments that TCP
// retransmits once the network heals.
//
// With a latency set, every byte is delivered that long after it arrived
// (plus a random jitter), in order, both ways: a store a network hop away
// (SetLatency).
type Proxy struct {
	// Addr is the host:port clients connect to.
	Addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener // nil while cut or closed
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
	// gate is open (nil) while bytes flow; while stalled it is a channel
	// that Unstall closes.
	gate chan struct{}
	// delay and jitter are the one-way latency (see SetLatency).
	delay, jitter time.Duration
}

// SetLatency delays every byte by oneWay plus a random share of jitter,
// each way, from now on (zero: none): a round trip through the proxy
// takes 2*oneWay more. Bytes keep their order, so a chunk drawn a shorter
// delay than the one before it waits for that one.
func (p *Proxy) SetLatency(oneWay, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.jitter = oneWay, jitter
}

// latency draws the delay of a chunk that arrives now.
func (p *Proxy) latency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.delay
	if p.jitter > 0 {
		d += rand.N(p.jitter)
	}
	return d
}

// NewProxy starts a proxy on a free loopback port that forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, conns: make(map[net.Conn]struct{})}
	p.serve(ln)
	return p, nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by Cut or Close
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(ln, c)
			}()
		}
	}()
}

// forward copies both ways between c and a new connection to the target
// until either side ends, or the proxy cuts them.
func (p *Proxy) forward(ln net.Listener, c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln != ln { // cut while this connection was being set up
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()

	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			c.Close()
			s.Close()
			p.mu.Lock()
			delete(p.conns, c)
			delete(p.conns, s)
			p.mu.Unlock()
		})
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pipe(s, c)
		closeBoth()
	}()
	p.pipe(c, s)
	closeBoth()
}

// pipe copies from src to dst until either fails, holding what it read
// while the proxy is stalled, and delaying it by the latency. A reader
// stamps each chunk with when it is due and a writer delivers it then, so
// that a slow link still carries as many bytes a second as a fast one.
func (p *Proxy) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.latency())
				if due.Before(last) {
					due = last // in order
				}
				last = due
				chunks <- chunk{buf[:n], due}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		for range chunks { // let the reader end once dst failed
		}
	}()
	for c := range chunks {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		p.waitFlowing()
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			return
		}
	}
}

// waitFlowing returns at once unless the proxy is stalled, then when it
// is unstalled.
func (p *Proxy) waitFlowing() {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	if gate != nil {
		<-gate
	}
}

// Stall stops forwarding bytes, both ways, on every connection, open or
// new, without closing any.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

// Unstall forwards bytes again, those held first.
func (p *Proxy) Unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

// Cut stops listening and closes every open connection, both ways.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Restore listens on Addr again after Cut. It retries for a few seconds
// in case the port is briefly not reusable.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return errors.New("proxy closed")
	}
	if p.ln != nil {
		return nil
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			p.serve(ln)
			return nil
		}
	}
	return err
}

// Close cuts the proxy for good and waits for its goroutines.
func (p *Proxy) Close() {
	p.Cut()
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.Unstall() // held bytes meet closed connections: the goroutines end
	p.wg.Wait()
}

package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// These tests check the test harness itself (the upstream's failure modes
// and the proxy's stall), without Caddy: a failure-path test that passes
// because its failure was never produced proves nothing.

// upstreamPost sends a keyed POST straight to the upstream.
func upstreamPost(t *testing.T, up *caddyproc.Upstream, key string, header ...string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+up.Addr+"/orders", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func TestHarnessUpstreamBreaksOffMidBody(t *testing.T) {
	up := newUpstream(t)
	resp, body, err := upstreamPost(t, up, "break", "X-Upstream-Break-After", "1000", "X-Upstream-Status", "200")
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("got %v, %v; want status 200", resp, err)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the body: %v, want io.ErrUnexpectedEOF", err)
	}
	if resp.ContentLength <= 1000 || !bytes.Equal(body, caddyproc.Pattern(1000)) {
		t.Fatalf("Content-Length %d and %d body bytes, want more than 1000 declared and the first 1000 of the pattern", resp.ContentLength, len(body))
	}
	if resp.Header.Get("X-Key-Execution") != "1" {
		t.Fatalf("X-Key-Execution %q, want 1", resp.Header.Get("X-Key-Execution"))
	}
	testutil.Eventually(t, 5*time.Second, "the upstream handler to return", func() bool { return up.Finished("break") == 1 })
	if up.Executions("break") != 1 || up.Delivered("break") != 0 {
		t.Fatalf("executions %d, delivered %d; want 1 and 0", up.Executions("break"), up.Delivered("break"))
	}
}

func TestHarnessUpstreamStreamsSizedBodiesInChunks(t *testing.T) {
	up := newUpstream(t)
	const size = 100_000
	start := time.Now()
	resp, body, err := upstreamPost(t, up, "sized", "X-Upstream-Size", strconv.Itoa(size), "X-Upstream-Chunk-Delay", "10")
	if err != nil || resp.StatusCode != 201 || !bytes.Equal(body, caddyproc.Pattern(size)) {
		t.Fatalf("got %v, %d bytes, %v; want 201 and the %d-byte pattern", resp, len(body), err, size)
	}
	chunks := (size + caddyproc.ChunkSize - 1) / caddyproc.ChunkSize
	if took := time.Since(start); took < time.Duration(chunks-1)*10*time.Millisecond {
		t.Fatalf("took %s, want at least %d pauses of 10ms", took, chunks-1)
	}
	testutil.Eventually(t, 5*time.Second, "the upstream handler to return", func() bool { return up.Finished("sized") == 1 })
	if up.Delivered("sized") != 1 {
		t.Fatal("a body read to the end does not count as delivered")
	}

	// A reader that hangs up early: the upstream notices, and the answer
	// does not count as delivered.
	conn, err := net.Dial("tcp", up.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /orders HTTP/1.1\r\nHost: up\r\nIdempotency-Key: hung-up\r\nX-Upstream-Size: 2000000\r\nX-Upstream-Chunk-Delay: 5\r\nContent-Length: 0\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r.Body, make([]byte, 10_000)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	testutil.Eventually(t, 20*time.Second, "the upstream to give up on a reader that hung up", func() bool { return up.Finished("hung-up") == 1 })
	if up.Delivered("hung-up") != 0 {
		t.Fatal("an answer its reader hung up on counts as delivered")
	}
}

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoes writes msg on c and reports whether it comes back within d,
// failing the test if the connection breaks. What does not come back in
// time is still on its way.
func echoes(t *testing.T, c net.Conn, r *bufio.Reader, msg string, d time.Duration) bool {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("writing through the proxy: %v", err)
	}
	return comesBack(t, c, r, msg, d)
}

func comesBack(t *testing.T, c net.Conn, r *bufio.Reader, msg string, d time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	got := make([]byte, len(msg))
	_, err := io.ReadFull(r, got)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false
	case err != nil:
		t.Fatalf("reading through the proxy: %v (the connection must stay open)", err)
	case string(got) != msg:
		t.Fatalf("read %q through the proxy, want %q", got, msg)
	}
	return true
}

func TestHarnessProxyStallHoldsBytesWithoutClosingConnections(t *testing.T) {
	p := proxyTo(t, echoServer(t))
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.DialTimeout("tcp", p.Addr, time.Second)
		if err != nil {
			t.Fatalf("connecting to the proxy: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	old, oldR := dial()
	if !echoes(t, old, oldR, "before\n", 5*time.Second) {
		t.Fatal("no echo through the proxy before the stall")
	}

	p.Stall()
	if echoes(t, old, oldR, "stalled\n", 300*time.Millisecond) {
		t.Fatal("bytes went through a stalled proxy")
	}
	fresh, freshR := dial() // accepted while stalled
	if echoes(t, fresh, freshR, "new\n", 300*time.Millisecond) {
		t.Fatal("bytes went through a stalled proxy on a new connection")
	}

	p.Unstall()
	// What was held goes through now, on both connections.
	if !comesBack(t, old, oldR, "stalled\n", 5*time.Second) || !comesBack(t, fresh, freshR, "new\n", 5*time.Second) {
		t.Fatal("bytes held during the stall did not go through after Unstall")
	}
	if !echoes(t, old, oldR, "after\n", 5*time.Second) {
		t.Fatal("no echo after Unstall")
	}

	// Cut still closes, and Restore still reopens.
	p.Cut()
	old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := oldR.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("reading after Cut: %v, want the connection closed", err)
	}
	mustRestore(t, p)
	again, againR := dial()
	if !echoes(t, again, againR, "restored\n", 5*time.Second) {
		t.Fatal("no echo after Restore")
	}
}

func TestHarnessUpstreamLogsExecutionsAndNamesTheirRequests(t *testing.T) {
	done := make(chan caddyproc.Execution, 2)
	up, err := caddyproc.NewUpstreamWith(caddyproc.UpstreamOptions{
		Echo:        []string{"X-Client"},
		OnExecution: func(x caddyproc.Execution) { done <- x },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })

	resp, body, err := upstreamPost(t, up, "named", "X-Client", "c1", "X-Upstream-Status", "202")
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("got %v, %v; want 202", resp, err)
	}
	const want = `{"execution":1,"key_execution":1,"request_bytes":2,"key":"named","echo":{"X-Client":"c1"}}`
	if string(body) != want || resp.Header.Get("X-Execution") != "1" {
		t.Fatalf("answer %s, X-Execution %q; want %s and 1", body, resp.Header.Get("X-Execution"), want)
	}
	x := <-done
	if x.N != 1 || x.Status != 202 || string(x.Answer) != want || string(x.Body) != `{}` ||
		x.Header.Get("X-Client") != "c1" || x.BrokeOff || !x.Delivered || x.End.Before(x.Start) {
		t.Fatalf("logged %+v", x)
	}

	if _, _, err := upstreamPost(t, up, "broken", "X-Upstream-Break-After", "10"); err == nil {
		t.Fatal("a broken-off answer read without error")
	}
	if x := <-done; x.N != 2 || x.Status != 201 || !x.BrokeOff || x.Delivered || len(x.Answer) != 10 {
		t.Fatalf("logged %+v, want a broken-off 201 after 10 bytes", x)
	}
}

// SetLatency delays both ways, on connections already open, and keeps
// every byte, in order, however the jitter falls.
func TestHarnessProxyLatencyDelaysBothWaysAndKeepsBytesInOrder(t *testing.T) {
	p := proxyTo(t, echoServer(t))
	c, err := net.DialTimeout("tcp", p.Addr, time.Second)
	if err != nil {
		t.Fatalf("connecting to the proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	if !echoes(t, c, r, "before\n", 5*time.Second) {
		t.Fatal("no echo through the proxy before the latency was set")
	}

	const oneWay, jitter = 50 * time.Millisecond, 20 * time.Millisecond
	p.SetLatency(oneWay, jitter)
	// A round trip through the proxy takes at least twice the one-way
	// latency (the echo server answers at once): both ways are delayed.
	for i := range 3 {
		start := time.Now()
		if !echoes(t, c, r, fmt.Sprintf("ping %d\n", i), 10*time.Second) {
			t.Fatalf("ping %d did not come back through the proxy", i)
		}
		if took := time.Since(start); took < 2*oneWay {
			t.Fatalf("ping %d came back after %s, want at least %s (%s each way)", i, took, 2*oneWay, oneWay)
		}
	}

	// Many small writes in a row (chunks of their own, each drawn its own
	// delay), then a large one: everything comes back whole and in order.
	var want bytes.Buffer
	for i := range 2000 {
		fmt.Fprintf(&want, "%06d\n", i)
	}
	want.Write(caddyproc.Pattern(1 << 20))
	written := make(chan error, 1)
	go func() {
		b := want.Bytes()
		for i := 0; i < 2000*7; i += 7 {
			if _, err := c.Write(b[i : i+7]); err != nil {
				written <- err
				return
			}
		}
		_, err := c.Write(b[2000*7:])
		written <- err
	}()
	got := make([]byte, want.Len())
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read %d of %d bytes back through the proxy: %v", n, want.Len(), err)
	}
	if err := <-written; err != nil {
		t.Fatalf("writing through the proxy: %v", err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		i := 0
		for i < len(got) && got[i] == want.Bytes()[i] {
			i++
		}
		t.Fatalf("the bytes came back changed from offset %d: %q, want %q", i, got[i:min(len(got), i+32)], want.Bytes()[i:min(want.Len(), i+32)])
	}

	// No latency again: bytes still flow.
	p.SetLatency(0, 0)
	if !echoes(t, c, r, "after\n", 5*time.Second) {
		t.Fatal("no echo after the latency was taken away")
	}
}

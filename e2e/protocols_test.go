package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
)

// These helpers reach Caddy over each protocol a client may speak to it:
// HTTP/1.1, HTTP/2 over TLS, h2c (HTTP/2 without TLS, prior knowledge) and
// HTTP/3 (QUIC, on the UDP port of the TLS site), with clients that take
// the answer slowly: a small TCP receive buffer for HTTP/1.1, small flow
// control windows for HTTP/2 and HTTP/3, so that a client that reads
// slowly holds the server's writes back as a slow client on a real
// network does.

// protocol is how a client reaches Caddy.
type protocol struct {
	name string
	tls  bool   // the site is served over TLS with a certificate of the test's own
	opts string // the server's protocols option
}

var (
	overH1  = protocol{name: "h1", opts: "h1"}
	overH2  = protocol{name: "h2", tls: true, opts: "h1 h2"}
	overH2C = protocol{name: "h2c", opts: "h1 h2c"}
	overH3  = protocol{name: "h3", tls: true, opts: "h1 h2 h3"}

	allProtocols = []protocol{overH1, overH2, overH2C, overH3}
)

// protoSite is a server (a Caddy instance, or one of Go's in tests of
// the clients) serving a site over a protocol.
type protoSite struct {
	*caddyproc.Instance
	proto protocol
	base  string         // the site's base URL
	roots *x509.CertPool // the TLS site's certificate, for clients
}

// startOver runs a Caddy instance serving routes over p on a free port
// until the test ends. Its log is printed if a test that judges it fails
// (logOnFailure).
func startOver(t *testing.T, p protocol, name, routes string) *protoSite {
	t.Helper()
	port, err := caddyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv := &protoSite{proto: p}
	cfg := caddyproc.Config{Globals: fmt.Sprintf("\tservers {\n\t\tprotocols %s\n\t}", p.opts)}
	if p.tls {
		certFile, keyFile, roots := localCert(t)
		srv.roots = roots
		srv.base = fmt.Sprintf("https://127.0.0.1:%d", port)
		cfg.Sites = fmt.Sprintf("https://:%d {\n\tbind 127.0.0.1\n\ttls %s %s\n%s\n}\n", port, certFile, keyFile, routes)
	} else {
		srv.base = fmt.Sprintf("http://127.0.0.1:%d", port)
		cfg.Sites = fmt.Sprintf("http://:%d {\n\tbind 127.0.0.1\n%s\n}\n", port, routes)
	}
	inst, err := caddyproc.Start(caddyBin, t.TempDir(), name, port, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Stop()
		// Whatever the test did, Caddy must never have panicked.
		log := inst.Log()
		for _, mark := range []string{"http: panic serving", "\npanic: "} {
			if i := strings.Index(log, mark); i >= 0 {
				t.Errorf("caddy %s panicked:\n%s", name, log[i:min(len(log), i+4000)])
			}
		}
	})
	srv.Instance = inst
	return srv
}

// logOnFailure prints the end of srv's log if t fails.
func (srv *protoSite) logOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of caddy %s (last 40 lines):\n%s", srv.Name, tail(srv.Log(), 40))
		}
	})
}

// localCert writes a self-signed certificate for 127.0.0.1 and localhost
// and its key into a directory of the test, and returns their paths and a
// pool that trusts the certificate.
func localCert(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	c, err := caddyproc.NewCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return c.CertFile, c.KeyFile, c.Roots
}

// slowClientReceiveBuffer and slowClientMSS shape an HTTP/1.1 client's
// TCP connection: a small receive buffer and an Ethernet-sized segment,
// set before connecting. On loopback, with its 64 KiB segments, the
// server's send buffer would grow to megabytes and take in any answer
// the client leaves unread; shaped, it holds some 30 KB while the client
// reads nothing. (While the client reads, Linux grows the server's send
// buffer with every acknowledgement, faster than a reader of 1 KB/s
// drains it: HTTP/1.1 cannot hold a server back as tightly as the flow
// control of HTTP/2 and HTTP/3.)
const (
	slowClientReceiveBuffer = 1 << 10
	slowClientMSS           = 1460
)

// client is an HTTP client of srv over its protocol, on connections of its
// own (none shared with another client), closed when the test ends. A
// slow client is shaped as above; otherwise the library's defaults apply.
func (srv *protoSite) client(t *testing.T, slow bool) *http.Client {
	t.Helper()
	var rt http.RoundTripper
	switch srv.proto {
	case overH1:
		dialer := &net.Dialer{Timeout: 5 * time.Second}
		if slow {
			dialer.Control = shapeTCP(slowClientReceiveBuffer, slowClientMSS)
		}
		tr := &http.Transport{DialContext: dialer.DialContext, DisableCompression: true}
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	case overH2, overH2C, overH3:
		// Slow: the small flow-control windows of caddyproc.SlowWindow.
		// Go's HTTP/2 client would otherwise take 4 MiB per stream,
		// quic-go's up to 6 MiB, into buffers of their own, whatever the
		// reader does.
		p := map[string]caddyproc.Proto{"h2": caddyproc.H2, "h2c": caddyproc.H2C, "h3": caddyproc.H3}[srv.proto.name]
		cert := &caddyproc.Cert{Roots: srv.roots}
		rt = cert.Transport(p, slow)
		t.Cleanup(func() { caddyproc.CloseTransport(rt) })
	default:
		t.Fatalf("unknown protocol %q", srv.proto.name)
	}
	// A safety bound: the slowest reader of these tests is done in two
	// minutes.
	return &http.Client{Transport: rt, Timeout: 3 * time.Minute}
}

// request POSTs key to srv's /orders with header pairs through c, and
// checks that the answer came over srv's protocol. The body is the
// caller's to read and close.
func (srv *protoSite) request(c *http.Client, key string, header ...string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, srv.base+"/orders", strings.NewReader(`{"amount":10}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if want := map[protocol]int{overH1: 1, overH2: 2, overH2C: 2, overH3: 3}[srv.proto]; resp.ProtoMajor != want {
		resp.Body.Close()
		return nil, fmt.Errorf("the answer came over %s, want HTTP/%d", resp.Proto, want)
	}
	return resp, nil
}

// post is postWith on a fresh client with the library's defaults (a
// connection of its own).
func (srv *protoSite) post(t *testing.T, key string, header ...string) reply {
	t.Helper()
	return srv.postWith(srv.client(t, false), key, header...)
}

// postWith is request through c, with the whole answer read.
func (srv *protoSite) postWith(c *http.Client, key string, header ...string) reply {
	resp, err := srv.request(c, key, header...)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// unsizedBody asks the upstream for an answer of n bytes of
// caddyproc.Pattern without Content-Length, sent as fast as it can: only
// how the stream ends tells a client whether it got the whole answer.
// (Caddy reads such an answer one chunk of the upstream's at a time,
// caddyproc.ChunkSize; sized(n, 0) declares its length, and Caddy reads it
// in pieces of up to 32 KiB.)
func unsizedBody(n int) []string { return append(sized(n, 0), "X-Upstream-Unsized", "true") }

// readEnd is how reading an answer's body ended.
type readEnd struct {
	got  []byte
	err  error // nil: a clean end of stream
	took time.Duration
}

func (e readEnd) String() string {
	how := "a clean end of stream"
	if e.err != nil {
		how = "error: " + e.err.Error()
	}
	return fmt.Sprintf("%d bytes in %s, then %s", len(e.got), e.took.Round(100*time.Millisecond), how)
}

// whole reports whether e is the whole of want, ended cleanly.
func (e readEnd) whole(want []byte) bool { return e.err == nil && bytes.Equal(e.got, want) }

// readPaced reads r at rate bytes a second, a quarter of that at a time,
// to its end or its first error.
func readPaced(r io.Reader, rate int) readEnd {
	start := time.Now()
	var got []byte
	buf := make([]byte, max(1, rate/4))
	for {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return readEnd{got: got, err: err, took: time.Since(start)}
		}
		// The pace: len(got) bytes may be taken rate per second.
		time.Sleep(time.Until(start.Add(time.Duration(len(got)) * time.Second / time.Duration(rate))))
	}
}

// readRest reads r to its end or its first error, as fast as it comes.
func readRest(r io.Reader, already []byte) readEnd {
	start := time.Now()
	rest, err := io.ReadAll(r)
	return readEnd{got: append(already, rest...), err: err, took: time.Since(start)}
}

// firstDifference is the offset of the first byte where got and want
// differ, or the length of the shorter.
func firstDifference(got, want []byte) int {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	return min(len(got), len(want))
}

func TestHarnessUpstreamStreamsUnsizedBodies(t *testing.T) {
	up := newUpstream(t)
	resp, body, err := upstreamPost(t, up, "unsized", unsizedBody(100_000)...)
	if err != nil || resp.StatusCode != 201 || !bytes.Equal(body, caddyproc.Pattern(100_000)) {
		t.Fatalf("got %v, %d bytes, %v; want 201 and the 100000-byte pattern", resp, len(body), err)
	}
	if resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("Content-Length %d, Transfer-Encoding %v; want none and chunked", resp.ContentLength, resp.TransferEncoding)
	}
}

// TestHarnessReachesCaddyOverEveryProtocol: every protocol of these tests
// reaches a real Caddy and gets its answer, recorded and replayed, over
// that protocol (request checks the version of every answer).
func TestHarnessReachesCaddyOverEveryProtocol(t *testing.T) {
	up := newUpstream(t)
	for _, p := range allProtocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			srv := startOver(t, p, "over-"+p.name, route(up, ""))
			srv.logOnFailure(t)
			key := "reach-" + p.name
			first := srv.post(t, key)
			if !first.isNew() {
				t.Fatalf("first request: %s, want the upstream's 201", first)
			}
			if again := srv.post(t, key); !again.isReplayOf(1) {
				t.Fatalf("retry: %s (replayed %v), want the replay of execution 1", again, again.replayed())
			}
			assertExecutions(t, up, key, 1)
		})
	}
}

// goProtoSite serves h over p on loopback with Go's own servers (quic-go's
// for HTTP/3), for tests of the clients themselves, until the test ends.
func goProtoSite(t *testing.T, p protocol, h http.Handler) *protoSite {
	t.Helper()
	srv := &protoSite{proto: p}
	switch p {
	case overH1, overH2C:
		ts := httptest.NewUnstartedServer(h)
		ts.Config.Protocols = new(http.Protocols)
		ts.Config.Protocols.SetHTTP1(true)
		ts.Config.Protocols.SetUnencryptedHTTP2(p == overH2C)
		ts.Start()
		t.Cleanup(ts.Close)
		srv.base = ts.URL
	case overH2:
		ts := httptest.NewUnstartedServer(h)
		ts.EnableHTTP2 = true
		ts.StartTLS()
		t.Cleanup(ts.Close)
		srv.base = ts.URL
		srv.roots = x509.NewCertPool()
		srv.roots.AddCert(ts.Certificate())
	case overH3:
		certFile, keyFile, roots := localCert(t)
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &http3.Server{Handler: h, TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}})}
		go func() { _ = s.Serve(conn) }()
		t.Cleanup(func() { s.Close(); conn.Close() })
		srv.base = "https://" + conn.LocalAddr().String()
		srv.roots = roots
	}
	return srv
}

// TestHarnessSlowClientsHoldTheServerBack: a slow client that reads
// nothing of an answer lets the server write only a few tens of kilobytes
// before its writes block, over every protocol; with the library's
// defaults the same client would let it write far more (HTTP/2: 4 MiB of
// stream window). Without this, a slow reader would read from its own
// buffers, and the server would never notice it.
func TestHarnessSlowClientsHoldTheServerBack(t *testing.T) {
	const bound = 96 << 10
	for _, p := range allProtocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			written := make(chan int, 1)
			srv := goProtoSite(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				w.WriteHeader(http.StatusCreated)
				_ = rc.Flush()
				piece, n := make([]byte, 1<<10), 0
				for n < 8<<20 {
					_ = rc.SetWriteDeadline(time.Now().Add(time.Second))
					k, err := w.Write(piece)
					if err == nil {
						err = rc.Flush()
					}
					n += k
					if err != nil {
						break
					}
				}
				written <- n
			}))
			for _, slow := range []bool{true, false} {
				resp, err := srv.request(srv.client(t, slow), "held-back")
				if err != nil {
					t.Fatal(err)
				}
				n := <-written
				resp.Body.Close()
				t.Logf("slow client %v: the server wrote %d bytes before its write blocked", slow, n)
				if slow && n > bound {
					t.Fatalf("the server wrote %d bytes to a slow client that read none, want at most %d", n, bound)
				}
				if !slow && n <= bound {
					t.Fatalf("the server wrote only %d bytes to a client with the library's defaults: the slow client's shaping proves nothing", n)
				}
			}
		})
	}
}

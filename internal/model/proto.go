package model

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Proto is the protocol an attempt is sent over. HTTP/1.1 goes over raw
// sockets as the model writes it byte for byte (hostile header forms
// included); the others through Go's clients, to Caddy's TLS server
// (HTTP/2, HTTP/3) or its plain one (h2c).
type Proto uint8

const (
	H1 Proto = iota
	H2
	H2C
	H3
)

func (p Proto) String() string { return [...]string{"h1", "h2", "h2c", "h3"}[p] }

// TLSServer is where Caddy serves HTTP/1.1, HTTP/2 and HTTP/3 with TLS:
// its port (TCP and UDP) and the certificate it serves, made for the test.
type TLSServer struct {
	Port              int
	CertFile, KeyFile string
	roots             *x509.CertPool
}

// NewTLSServer writes a self-signed certificate for localhost into dir.
func NewTLSServer(dir string, port int) (*TLSServer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	s := &TLSServer{Port: port, CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), roots: x509.NewCertPool()}
	s.roots.AddCert(cert)
	if err := os.WriteFile(s.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, err
	}
	return s, nil
}

// Flow-control windows of a client that reads slowly: small, so that a
// slow reader holds the server back as a phone on a bad network does,
// rather than buffering the whole answer (Go's HTTP/2 client takes 4 MB
// per stream by default).
const slowWindow = 16 << 10

// transport returns a fresh client transport for p (one connection of its
// own per attempt: an attempt that hangs up or stalls never affects
// another). slow makes its flow-control windows small.
func (s *TLSServer) transport(p Proto, slow bool) http.RoundTripper {
	tc := &tls.Config{RootCAs: s.roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	switch p {
	case H3:
		qc := &quic.Config{MaxIdleTimeout: time.Minute}
		if slow {
			qc.InitialStreamReceiveWindow, qc.MaxStreamReceiveWindow = slowWindow, slowWindow
			qc.InitialConnectionReceiveWindow, qc.MaxConnectionReceiveWindow = 4*slowWindow, 4*slowWindow
		}
		return &http3.Transport{TLSClientConfig: tc, QUICConfig: qc, DisableCompression: true}
	default:
		t := &http.Transport{TLSClientConfig: tc, DisableCompression: true, Protocols: new(http.Protocols)}
		if p == H2C {
			t.Protocols.SetUnencryptedHTTP2(true)
		} else {
			t.Protocols.SetHTTP2(true)
		}
		if slow {
			t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: slowWindow, MaxReceiveBufferPerConnection: 4 * slowWindow}
		}
		return t
	}
}

// sendHTTP sends a over p with Go's client and reads the answer as its
// mode says. plain is the address of Caddy's plain server (h2c).
func sendHTTP(plain string, tlsSrv *TLSServer, p Proto, a *Attempt, clock func() time.Time) *Result {
	res := &Result{Sent: clock()}
	defer func() { res.Done = clock() }()
	rt := tlsSrv.transport(p, a.Mode == SlowRead || a.Mode == StallResume)
	defer closeTransport(rt)

	base := fmt.Sprintf("https://127.0.0.1:%d", tlsSrv.Port)
	if p == H2C {
		base = "http://" + plain
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var body io.Reader
	if len(a.Body) > 0 || a.Method == http.MethodPost || a.Method == http.MethodPut || a.Method == http.MethodPatch {
		body = bytes.NewReader(a.Body)
		if a.Chunked {
			body = io.MultiReader(bytes.NewReader(a.Body)) // no length: streamed
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
	req.Host = a.Host
	for _, kv := range a.Header {
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
		return readSlowly(body, a.Rate)
	case StallResume:
		time.Sleep(a.Stall)
	}
	return io.ReadAll(body)
}

// readSlowly reads body at rate bytes a second, in small reads.
func readSlowly(body io.Reader, rate int) ([]byte, error) {
	const piece = 512
	var out bytes.Buffer
	buf := make([]byte, piece)
	start := time.Now()
	for {
		n, err := body.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.Bytes(), nil
		}
		if err != nil {
			return out.Bytes(), err
		}
		// Pace: the bytes read so far at rate, measured from the start.
		if due := start.Add(time.Duration(out.Len()) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
	}
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

func closeTransport(rt http.RoundTripper) {
	switch t := rt.(type) {
	case *http.Transport:
		t.CloseIdleConnections()
	case *http3.Transport:
		_ = t.Close()
	}
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

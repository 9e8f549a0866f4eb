package caddyproc

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Clients of every protocol Caddy serves, for tests that send requests
// over HTTP/2 (TLS and h2c) and HTTP/3, and clients that read slowly.

// Proto is an HTTP protocol a client speaks.
type Proto uint8

const (
	H1  Proto = iota // HTTP/1.1
	H2               // HTTP/2 over TLS
	H2C              // HTTP/2 without TLS (prior knowledge)
	H3               // HTTP/3 over QUIC
)

func (p Proto) String() string { return [...]string{"h1", "h2", "h2c", "h3"}[p] }

// Cert is a self-signed certificate for localhost and 127.0.0.1, in PEM
// files for Caddy's tls app (load_files), and the pool its clients trust.
type Cert struct {
	CertFile, KeyFile string
	Roots             *x509.CertPool
}

// NewCert makes a certificate in dir.
func NewCert(dir string) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
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
	c := &Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), Roots: x509.NewCertPool()}
	c.Roots.AddCert(cert)
	if err := os.WriteFile(c.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, err
	}
	return c, nil
}

// SlowWindow is the flow-control window of a client that reads slowly:
// small, so that it holds the server back as a phone on a bad network
// does, rather than buffering the whole answer (Go's HTTP/2 client takes
// 4 MB a stream by default).
const SlowWindow = 16 << 10

// Transport returns a new client transport for p (HTTP/1.1 plain, the
// others trusting c; c may be nil for H1 and H2C). slow gives it small
// flow-control windows. Close it with CloseTransport.
func (c *Cert) Transport(p Proto, slow bool) http.RoundTripper {
	var tc *tls.Config
	if c != nil {
		tc = &tls.Config{RootCAs: c.Roots, MinVersion: tls.VersionTLS12}
	}
	if p == H3 {
		// Keep-alives as browsers send them (Chromium: every 15 s while a
		// stream is open): a server's QUIC connection closes after 30 s
		// without a packet, even with a stream open on it.
		qc := &quic.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: 15 * time.Second}
		if slow {
			qc.InitialStreamReceiveWindow, qc.MaxStreamReceiveWindow = SlowWindow, SlowWindow
			qc.InitialConnectionReceiveWindow, qc.MaxConnectionReceiveWindow = 4*SlowWindow, 4*SlowWindow
		}
		return &http3.Transport{TLSClientConfig: tc, QUICConfig: qc, DisableCompression: true}
	}
	t := &http.Transport{TLSClientConfig: tc, DisableCompression: true, Protocols: new(http.Protocols)}
	switch p {
	case H1:
		t.Protocols.SetHTTP1(true)
	case H2C:
		t.Protocols.SetUnencryptedHTTP2(true)
	default:
		t.Protocols.SetHTTP2(true)
	}
	if slow {
		t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: SlowWindow, MaxReceiveBufferPerConnection: 4 * SlowWindow}
	}
	return t
}

// CloseTransport closes what t holds open.
func CloseTransport(t http.RoundTripper) {
	switch t := t.(type) {
	case *http.Transport:
		t.CloseIdleConnections()
	case *http3.Transport:
		_ = t.Close()
	}
}

// ReadSlowly reads body at rate bytes a second, in small reads, paced
// from its start.
func ReadSlowly(body io.Reader, rate int) ([]byte, error) {
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
		if due := start.Add(time.Duration(out.Len()) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
	}
}

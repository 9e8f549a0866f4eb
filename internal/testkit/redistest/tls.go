package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// TLSServer is a private redis-server that also listens with TLS, with a
// certificate for "localhost" and 127.0.0.1 from a CA of the test's own,
// and that requires clients to present a certificate from that CA.
type TLSServer struct {
	*Server
	TLSAddr string // host:port of the TLS listener
	// PEM files: the CA, and a client certificate and key it signed.
	CAFile, CertFile, KeyFile string
}

// StartTLSServer starts a TLSServer, killed when the test ends.
func StartTLSServer(t testing.TB) *TLSServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "test CA", true)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	server, serverKey := newCert(t, ca, caKey, "localhost", false)
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", server.Raw)
	writeKey(t, filepath.Join(dir, "server.key"), serverKey)
	client, clientKey := newCert(t, ca, caKey, "caddy", false)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", client.Raw)
	writeKey(t, filepath.Join(dir, "client.key"), clientKey)

	var tlsAddr string
	s := start(t, "a TLS redis-server", func() (*Server, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		return startServer(t, bin, "", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", filepath.Join(dir, "server.pem"), "--tls-key-file", filepath.Join(dir, "server.key"),
			"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "yes")
	})
	return &TLSServer{Server: s, TLSAddr: tlsAddr,
		CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "client.pem"), KeyFile: filepath.Join(dir, "client.key")}
}

// newCert makes a certificate for name, signed by parent (self-signed
// when nil).
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage = nil
	} else if name == "localhost" {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t testing.TB, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}

package redis

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The Redis TLS options against a private redis-server that speaks TLS
// with a certificate from a test CA and requires a client certificate.
func TestRedisTLSOptionsReachATLSServer(t *testing.T) {
	srv := redistest.StartTLSServer(t)
	config := func(extra string) string {
		return fmt.Sprintf(`{"url":"redis://%s/0","key_prefix":"tls-%s:","timeout":"1s","dial_timeout":"1s"%s}`,
			srv.TLSAddr, redistest.RandomHex(4), extra)
	}
	// reserve provisions the storage and takes a new key in its store.
	reserve := func(extra string) error {
		ctx, _ := caddyContext(t)
		r := fromJSON(t, config(extra))
		if err := r.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		defer r.Cleanup()
		key := storage.Key{Scope: "tls", ID: redistest.RandomHex(4)}
		res, err := r.Store().Reserve(t.Context(), key, []byte("fp"), time.Minute)
		if err != nil {
			return err
		}
		if err := r.Store().Complete(t.Context(), key, res.Token, &storage.Response{Status: 201}, time.Minute); err != nil {
			return err
		}
		if res, err := r.Store().Reserve(t.Context(), key, []byte("fp"), time.Minute); err != nil || res.Outcome != storage.Replay {
			return fmt.Errorf("the completed key: %v, %v; want a replay", res.Outcome, err)
		}
		return nil
	}

	full := fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"localhost"`, srv.CAFile, srv.CertFile, srv.KeyFile)
	if err := reserve(full); err != nil {
		t.Fatalf("over TLS with the test CA and a client certificate: %v", err)
	}
	for name, extra := range map[string]string{
		"no client certificate":     fmt.Sprintf(`,"tls_ca_file":%q`, srv.CAFile),
		"the system's CAs":          fmt.Sprintf(`,"tls_cert_file":%q,"tls_key_file":%q`, srv.CertFile, srv.KeyFile),
		"a name the cert lacks":     fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"other.example"`, srv.CAFile, srv.CertFile, srv.KeyFile),
		"plain Redis on a TLS port": "",
	} {
		// The handler answers such an error with 503 (a certificate that
		// fails verification is not an outage: it fails closed even
		// under fail_open).
		if err := reserve(extra); err == nil {
			t.Errorf("%s: the key was taken: the server must not be reachable that way", name)
		}
	}
}

func TestRedisTLSFilesThatCannotBeReadFailProvision(t *testing.T) {
	ctx, _ := caddyContext(t)
	r := fromJSON(t, `{"url":"redis://127.0.0.1:1/0","tls_ca_file":"/nonexistent/ca.pem"}`)
	if err := r.Provision(ctx); err == nil {
		t.Fatal("a tls_ca_file that cannot be read was accepted")
	}
	if err := r.Cleanup(); err != nil {
		t.Fatal(err)
	}
}

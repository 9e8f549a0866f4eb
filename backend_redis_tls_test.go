package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-idempotency/caddy-idempotency/internal/redistest"
)

// The Redis TLS options against a private redis-server that speaks TLS
// with a certificate from a test CA and requires a client certificate.
func TestRedisTLSOptionsReachATLSServer(t *testing.T) {
	srv := redistest.StartTLSServer(t)
	storageJSON := func(extra string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"backend":"redis","url":"redis://%s/0","key_prefix":"tls-%s:","timeout":"1s","dial_timeout":"1s"%s}`,
			srv.TLSAddr, redistest.RandomHex(4), extra))
	}
	full := fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"localhost"`, srv.CAFile, srv.CertFile, srv.KeyFile)

	h := provision(t, &Handler{StorageRaw: storageJSON(full)})
	up := &upstream{}
	if w := serve(h, up, request("tls", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("over TLS with the test CA and a client certificate: %d %s", w.Code, w.Body)
	}
	if w := serve(h, up, request("tls", "{}")); w.Header().Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("replay over TLS: %d, upstream ran %d times", w.Code, up.calls.Load())
	}

	for name, extra := range map[string]string{
		"no client certificate":     fmt.Sprintf(`,"tls_ca_file":%q`, srv.CAFile),
		"the system's CAs":          fmt.Sprintf(`,"tls_cert_file":%q,"tls_key_file":%q`, srv.CertFile, srv.KeyFile),
		"a name the cert lacks":     fmt.Sprintf(`,"tls_ca_file":%q,"tls_cert_file":%q,"tls_key_file":%q,"tls_server_name":"other.example"`, srv.CAFile, srv.CertFile, srv.KeyFile),
		"plain Redis on a TLS port": "",
	} {
		h := provision(t, &Handler{StorageRaw: storageJSON(extra)})
		if w := serve(h, up, request("tls-"+strings.ReplaceAll(name, " ", "-"), "{}")); w.Code != http.StatusServiceUnavailable {
			t.Errorf("%s: %d, want 503 (fail_closed): the server must not be reachable that way", name, w.Code)
		}
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

func TestRedisTLSFilesThatCannotBeReadFailProvision(t *testing.T) {
	h := &Handler{StorageRaw: json.RawMessage(`{"backend":"redis","url":"redis://127.0.0.1:1/0","tls_ca_file":"/nonexistent/ca.pem"}`)}
	ctx, cancel := caddyContext(t)
	defer cancel()
	if err := tryProvision(t, ctx, h); err == nil {
		t.Fatal("a tls_ca_file that cannot be read was accepted")
	}
}

package inprocess_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// keysPath is the admin API's path for key under the scope given as the
// values of its template's placeholders.
func keysPath(key string, scope ...string) string {
	return "/idempotency/keys?" + url.Values{"key": {key}, "scope": scope}.Encode()
}

// TestAdminAPIOnCaddysAdminEndpoint shows and deletes a record through
// Caddy's admin endpoint, as an operator would.
func TestAdminAPIOnCaddysAdminEndpoint(t *testing.T) {
	up := newCountingUpstream(t)
	adminPort := freePort(t)
	base := loadCaddyfileGlobals(t, freePort(t), fmt.Sprintf("admin 127.0.0.1:%d", adminPort), `
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "via-admin", `{}`)
	scope := []string{"127.0.0.1", ""} // host, then an empty Authorization
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	resp, err := http.Get(adminURL + keysPath("via-admin", scope...))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"state":"completed"`) {
		t.Fatalf("admin GET: %d %s", resp.StatusCode, b)
	}
	req, _ := http.NewRequest(http.MethodDelete, adminURL+keysPath("via-admin", scope...), nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin DELETE: %d", resp.StatusCode)
	}
	post(t, base+"/orders", "via-admin", `{}`)
	if up.calls.Load() != 2 {
		t.Fatalf("after an admin DELETE the key must run again: %d calls", up.calls.Load())
	}
}

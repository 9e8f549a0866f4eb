package inprocess_test

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

func TestGlobalOptionErrors(t *testing.T) {
	cases := map[string]string{
		"unknown option":    "{\n\tidempotency {\n\t\tttl 1h\n\t}\n}\n",
		"duplicate storage": "{\n\tidempotency {\n\t\tstorage memory\n\t\tstorage memory\n\t}\n}\n",
		"argument":          "{\n\tidempotency memory\n}\n",
		"unknown backend":   "{\n\tidempotency {\n\t\tstorage nosuch\n\t}\n}\n",
	}
	for name, globals := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := globals + "\n:8080 {\n\tidempotency\n\trespond 200\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
			if err == nil || !strings.Contains(err.Error(), "Caddyfile:") {
				t.Fatalf("err %v, want an error with file and line", err)
			}
		})
	}
}

// TestGlobalStorageIsTheDefault configures Redis in the global
// idempotency option only: the directive's record lands under the global
// key prefix, and replays from there.
func TestGlobalStorageIsTheDefault(t *testing.T) {
	addr := redistest.Addr()
	redistest.Require(t, addr)
	prefix := "idempotency-test:" + redistest.RandomHex(6) + ":"
	t.Cleanup(func() { deleteRedisKeys(t, addr, prefix) })
	up := newCountingUpstream(t)
	base := loadCaddyfileGlobals(t, freePort(t), "admin off\n\tidempotency {\n\t\tstorage redis {\n\t\t\turl redis://"+addr+"/0\n\t\t\tkey_prefix "+prefix+"\n\t\t}\n\t}", `
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "g1", `{}`)
	if keys := redisKeys(t, addr, prefix); len(keys) != 1 {
		t.Fatalf("keys under the global prefix: %q, want the directive's one record", keys)
	}
	if resp, _ := post(t, base+"/orders", "g1", `{}`); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay through the global storage")
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

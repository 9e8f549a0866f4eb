package idempotency

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
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

func TestGlobalStorageIsTheDefault(t *testing.T) {
	addr := sharedRedis(t)
	prefix := redisPrefix()
	up := newCountingUpstream(t)
	base := loadCaddyfileGlobals(t, freePort(t), "admin off\n\tidempotency {\n\t\tstorage redis {\n\t\t\turl redis://"+addr+"/0\n\t\t\tkey_prefix "+prefix+"\n\t\t}\n\t}", `
	idempotency
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "g1", `{}`)
	var found string
	stores.Range(func(k, v any) bool {
		if v.(*pooledStore).backend == "redis" {
			found = k.(string)
		}
		return true
	})
	if found == "" {
		t.Fatal("the directive did not use the global Redis storage")
	}
	if resp, _ := post(t, base+"/orders", "g1", `{}`); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay through the global storage")
	}
}

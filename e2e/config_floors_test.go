package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// Floors (docs/caddyfile.md, Subdirectives): lock_timeout and ttl are at least
// 1s. A lease of a nanosecond lapses before the request that holds it has
// started, and a record kept for a nanosecond is never replayed: both
// would silently run every retry again, so `caddy validate` refuses them,
// from a Caddyfile and from JSON (where a bare number is nanoseconds).

// caddyValidate runs `caddy validate` on config and returns whether it
// was accepted and what Caddy said.
func caddyValidate(t *testing.T, config, adapter string) (ok bool, out string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"validate", "--config", path}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	cmd := exec.Command(caddyBin, args...)
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config-home"))
	b, err := cmd.CombinedOutput()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("running caddy validate: %v", err)
	}
	return err == nil, string(b)
}

func caddyfileWith(options string) string {
	return "{\n\tadmin off\n\tpersist_config off\n}\n\nhttp://127.0.0.1:8080 {\n\tidempotency {\n\t\t" + options + "\n\t}\n\trespond \"ok\"\n}\n"
}

func jsonWith(member string) string {
	return `{"admin":{"disabled":true,"config":{"persist":false}},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:8080"],` +
		`"routes":[{"handle":[{"handler":"idempotency",` + member + `},{"handler":"static_response","body":"ok"}]}]}}}}}`
}

func TestLockTimeoutAndTTLBelowOneSecondAreConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		name, config, adapter string
		option                string // "" for a config that must be accepted
	}{
		{"caddyfile lock_timeout 1ns", caddyfileWith("lock_timeout 1ns"), "caddyfile", "lock_timeout"},
		{"caddyfile ttl 1ns", caddyfileWith("ttl 1ns"), "caddyfile", "ttl"},
		{"json lock_timeout 30 (nanoseconds)", jsonWith(`"lock_timeout":30`), "", "lock_timeout"},
		{"json ttl 30 (nanoseconds)", jsonWith(`"ttl":30`), "", "ttl"},
		// The floors themselves are allowed: the test tells refusals apart
		// from a config that is wrong for another reason.
		{"caddyfile lock_timeout 1s", caddyfileWith("lock_timeout 1s"), "caddyfile", ""},
		{"caddyfile ttl 1s", caddyfileWith("ttl 1s"), "caddyfile", ""},
		{"json lock_timeout 1s", jsonWith(`"lock_timeout":"1s"`), "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ok, out := caddyValidate(t, tt.config, tt.adapter)
			switch {
			case tt.option == "" && !ok:
				t.Fatalf("caddy validate refused a valid config:\n%s", tail(out, 10))
			case tt.option != "" && ok:
				t.Fatalf("caddy validate accepted %s, want it refused:\n%s", tt.name, tail(out, 10))
			case tt.option != "" && !regexp.MustCompile(`(^|[^a-z_])`+tt.option+`([^a-z_]|$)`).MatchString(out):
				t.Fatalf("caddy validate refused %s without naming %s:\n%s", tt.name, tt.option, tail(out, 10))
			}
		})
	}
}

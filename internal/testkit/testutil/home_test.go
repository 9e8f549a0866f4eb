package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// Caddy run by a test writes its autosaved config and its data into the
// tests' own home, never the user's, and a go command the tests run still
// finds the user's module and build caches and leaves nothing behind.
func TestTheTestsHaveAHomeOfTheirOwn(t *testing.T) {
	home := os.Getenv("HOME")
	if home == userHome || home == "" {
		t.Fatalf("HOME is %q, the user's own", home)
	}
	if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	if !strings.HasPrefix(caddy.ConfigAutosavePath, home+string(filepath.Separator)) {
		t.Fatalf("Caddy autosaves its config to %s, outside the tests' home %s", caddy.ConfigAutosavePath, home)
	}
	if _, err := os.Stat(caddy.ConfigAutosavePath); err != nil {
		t.Fatalf("caddy.Load wrote no autosave in the tests' home: %v", err)
	}
	if _, err := caddy.InstanceID(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "share", "caddy", "instance.uuid")); err != nil {
		t.Fatalf("Caddy's instance id is not in the tests' home: %v", err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	if cache := strings.TrimSpace(string(out)); strings.HasPrefix(cache, home) {
		t.Fatalf("the go command's module cache moved into the tests' home: %s", cache)
	}
	// Its telemetry is off there: no counters, and no sidecar that would
	// write into the home after the tests removed it.
	config, err := os.UserConfigDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(config, "go", "telemetry", "local")); !os.IsNotExist(err) {
		t.Fatalf("the go command kept telemetry in the tests' home (%v)", err)
	}
}
